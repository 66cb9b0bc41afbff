"""Frames stored once: `FrameBuffer`, the pool behind `frame_stacks`; see `tfbuffers.storage.frames`.

This module re-exports every public name of `tfbuffers.storage.frames`, its home since the storages got a
package of their own (the import path users know).
"""

from __future__ import annotations

from tfbuffers.storage.frames import (
    INITIAL_SLOTS,
    NOT_A_FRAME,
    UNKNOWN_HANDLE,
    FrameBuffer,
)

__all__ = [
    "INITIAL_SLOTS",
    "NOT_A_FRAME",
    "UNKNOWN_HANDLE",
    "FrameBuffer",
]
