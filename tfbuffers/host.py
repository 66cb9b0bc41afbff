"""A host-side buffer's calls as graph ops, and the host execution mode: see `tfbuffers.execution.host`.

This module re-exports every public name of `tfbuffers.execution.host`, its home since the execution modes
got a package of their own (the import path users know).
"""

from __future__ import annotations

from tfbuffers.execution.host import HostExecution, add_when_run, arrays, call, gather_all, now_or_when_run, sample

__all__ = ["HostExecution", "add_when_run", "arrays", "call", "gather_all", "now_or_when_run", "sample"]
