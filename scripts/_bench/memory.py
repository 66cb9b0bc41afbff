"""The whole run's memory: this process and every process under it (peers, actors, Ray's), summed while it runs."""

from __future__ import annotations

import os
import threading
from typing import Any

import psutil

INTERVAL = 0.5  # seconds between two samples of the process tree
PROPORTIONAL = os.path.exists("/proc/self/smaps_rollup")  # Linux 4.14 and later


def _proportional_bytes(pid: int) -> int:
    """`pid`'s proportional set size (Linux's `Pss` in `/proc/<pid>/smaps_rollup`); 0 for a process that has gone.

    A page shared by several processes is split among them, so the processes' sum counts it once.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class TreeMemory:
    """Samples every `INTERVAL` seconds, in a thread, the resident memory of this process and all its descendants.

    Two sums: `rss` (each process's resident set, so a page that several map, such as TensorFlow's libraries in
    four actors or Ray's object store, counted in each) and `pss` (proportional: each page once, what the machine
    holds). `phase(label)` names what runs from then on; `peaks()` gives each sum's peak, the label it was reached
    in, and the process count then. Use as a context manager.
    """

    def __init__(self, interval: float = INTERVAL) -> None:
        self._interval = interval
        self._label = "start"
        self._peaks: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tree-memory", daemon=True)

    def __enter__(self) -> TreeMemory:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join()
        self.sample()

    def phase(self, label: str) -> None:
        """What runs from now on, for the peaks reached in it."""
        with self._lock:
            self._label = label

    def sample(self) -> None:
        """One sample of the tree's sums, kept where it is a peak."""
        root = psutil.Process()
        try:
            processes = [root, *root.children(recursive=True)]
        except psutil.Error:
            processes = [root]
        rss, pss = 0, 0
        for process in processes:
            try:
                rss += process.memory_info().rss
            except psutil.Error:
                continue  # it ended between the listing and the read
            pss += _proportional_bytes(process.pid) if PROPORTIONAL else 0
        sums = {"rss": rss, "pss": pss} if PROPORTIONAL else {"rss": rss}
        with self._lock:
            for key, value in sums.items():
                if value > self._peaks.get(key, {}).get("bytes", -1):
                    self._peaks[key] = {"bytes": value, "during": self._label, "processes": len(processes)}

    def _watch(self) -> None:
        while not self._done.wait(self._interval):
            self.sample()

    def peaks(self) -> dict[str, dict[str, Any]]:
        """{"rss": {"bytes", "during", "processes"}, "pss": ...}: each sum's peak so far ("pss" absent off Linux)."""
        with self._lock:
            return {key: dict(value) for key, value in self._peaks.items()}
