"""Frames stored once: `FrameBuffer`, the pool behind the py buffers' `frame_stacks` storage.

Stacked observations (Atari's `uint8[84, 84, 4]`: the newest frame and the three
before it) repeat each frame in four consecutive observations. A `FrameBuffer`
keeps each distinct frame once, with a reference count, in one numpy array, and
hands out integer handles; a buffer stores handles and rebuilds the stacks with
one gather when it samples.

Frames are matched by content, exactly: a frame's hash only finds the candidates,
whose bytes are then compared, so two different frames never share a handle (a
collision costs one comparison). TF-Agents' `FrameBuffer` keys frames by their
hash alone, so two frames of one hash silently become one.

The API is TF-Agents' (`add_frame`, `on_delete`, `compress`, `decompress`,
`clear`, `len`, and checkpointing as a `tf.train.experimental.PythonState`),
handles being slot numbers rather than hashes; the buffers use the vectorised
`add_frames`, `release` and `gather`.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import tensorflow as tf

NOT_A_FRAME = (
    "frame: expected an array of shape {expected} and dtype {dtype} (this pool's first frame's), got {received}"
)
UNKNOWN_HANDLE = "handles: expected handles of frames held, got {handle}"
INITIAL_SLOTS = 64


def _frame_hash(data: bytes) -> int:
    """The key that finds a frame's candidates (any function of the bytes: equal bytes decide)."""
    return hash(data)


class FrameBuffer(tf.train.experimental.PythonState):
    """Distinct frames of one shape and dtype, each stored once, with reference counts.

    Not thread-safe: the owning buffer holds its lock around every call.

    Example:
    >>> pool = FrameBuffer()
    >>> a, b = np.zeros([2, 2], np.uint8), np.ones([2, 2], np.uint8)
    >>> handles = pool.compress(np.stack([a, b, b], axis=-1))
    >>> len(pool), handles.tolist()
    (2, [0, 1, 1])
    >>> pool.decompress(handles).shape
    (2, 2, 3)
    """

    def __init__(self, capacity_hint: int = INITIAL_SLOTS, frames: np.ndarray | None = None) -> None:
        """An empty pool; `capacity_hint` frames are reserved once the first frame fixes shape and dtype.

        With `frames` (`[slots, *frame shape]`, an array a storage keeps: a memory-mapped file), the pool's
        frames are that array, never grown: slots are written only as frames are added, lowest first, and a
        freed slot is reused before a new one is taken. `recount` then takes the references its rows hold.
        """
        self._capacity_hint = max(int(capacity_hint), 1)
        self._given = frames
        self.clear()

    def clear(self) -> None:
        """Forgets every frame (handles given out before are invalid)."""
        self._frames: np.ndarray | None = None  # [slots, *frame shape], allocated at the first frame
        self._counts = np.zeros(0, np.int64)
        self._hashes = np.zeros(0, np.int64)
        if self._given is not None:
            self._allocate(self._given[0], len(self._given))
        self._index: dict[int, list[int]] = {}  # hash -> slots holding frames of that hash
        self._free: list[int] = []
        self._top = 0  # slots at or above it were never used: their pages are never touched
        self._held = 0

    def __len__(self) -> int:
        """The number of distinct frames held."""
        return self._held

    @property
    def frame_shape(self) -> tuple[int, ...] | None:
        """The shape of the frames, once one was added."""
        return None if self._frames is None else self._frames.shape[1:]

    @property
    def nbytes(self) -> int:
        """Bytes of the slots in use so far (the high-water mark), plus counts and hashes."""
        if self._frames is None:
            return 0
        return self._top * (self._frames[0].nbytes + 16)

    # TF-Agents' API.

    def add_frame(self, frame: Any) -> int:
        """Adds one reference to `frame`; returns its handle."""
        frame = np.asarray(frame)
        return int(self.add_frames(frame[None])[0])

    def on_delete(self, handles: Any) -> None:
        """Drops one reference for each handle; frames left with none are freed."""
        self.release(np.asarray(handles, np.int64).ravel())

    def compress(self, observation: Any, split_axis: int = -1) -> np.ndarray:
        """The handles of `observation`'s frames along `split_axis` (each added once more)."""
        observation = np.asarray(observation)
        frames = np.split(observation, observation.shape[split_axis], split_axis)
        return self.add_frames(np.stack(frames))

    def decompress(self, handles: Any, split_axis: int = -1) -> np.ndarray:
        """The frames of `handles` concatenated along `split_axis` (the inverse of `compress`)."""
        return np.concatenate(list(self.gather(np.asarray(handles, np.int64))), axis=split_axis)

    def serialize(self) -> bytes:
        """The frames held, their counts and slots, as `numpy.savez` bytes (no pickle)."""
        held = np.flatnonzero(self._counts[: self._top] > 0)
        frames = np.zeros(0) if self._frames is None else self._frames[held]
        output = io.BytesIO()
        np.savez(output, slots=held, counts=self._counts[held], frames=frames, top=np.int64(self._top))
        return output.getvalue()

    def deserialize(self, string_value: bytes) -> None:
        """Replaces the contents by `serialize()`'s."""
        with np.load(io.BytesIO(string_value), allow_pickle=False) as saved:
            slots, counts, frames, top = saved["slots"], saved["counts"], saved["frames"], int(saved["top"])
        self.clear()
        if slots.size == 0:
            return
        self._allocate(frames[0], max(top, self._capacity_hint))
        assert self._frames is not None
        self._frames[slots] = frames
        self._counts[slots] = counts
        self._top = top
        self._free = sorted(set(range(top)) - set(slots.tolist()), reverse=True)
        for slot, frame in zip(slots.tolist(), frames):
            key = _frame_hash(frame.tobytes())
            self._hashes[slot] = key
            self._index.setdefault(key, []).append(slot)
        self._held = int(slots.size)

    # Vectorised.

    def add_frames(self, frames: np.ndarray) -> np.ndarray:
        """Adds one reference to each of `frames` (`[k, *frame shape]`); returns their `[k]` int64 handles."""
        if self._frames is None:
            self._allocate(frames[0] if len(frames) else frames, self._capacity_hint)
        assert self._frames is not None
        if frames.shape[1:] != self._frames.shape[1:] or frames.dtype != self._frames.dtype:
            raise ValueError(
                NOT_A_FRAME.format(
                    expected=self._frames.shape[1:], dtype=self._frames.dtype, received=f"{frames.dtype} {frames.shape}"
                )
            )
        handles = np.empty(len(frames), np.int64)
        for i, frame in enumerate(frames):
            data = frame.tobytes()
            key = _frame_hash(data)
            slot = -1
            for candidate in self._index.get(key, ()):
                if self._frames[candidate].tobytes() == data:  # the bytes decide, not the hash
                    slot = candidate
                    break
            if slot < 0:
                slot = self._new_slot()
                self._frames[slot] = frame
                self._hashes[slot] = key
                self._index.setdefault(key, []).append(slot)
                self._held += 1
            self._counts[slot] += 1
            handles[i] = slot
        return handles

    def reference(self, handles: np.ndarray) -> None:
        """Adds one reference for each handle (of frames held; a handle may repeat)."""
        slots, counts = np.unique(handles, return_counts=True)
        self._counts[slots] += counts

    def held(self, handles: np.ndarray) -> np.ndarray:
        """Whether each handle (any shape) is a frame held now."""
        inside = (handles >= 0) & (handles < self._top)
        return inside & (self._counts[np.where(inside, handles, 0)] > 0)

    def release(self, handles: np.ndarray) -> None:
        """Drops one reference for each handle; frames left with none are freed.

        Raises:
          ValueError: If a handle is not a frame held (or is given more times than it is referenced);
            nothing is changed then.
        """
        if handles.size == 0:
            return
        slots, drops = np.unique(handles, return_counts=True)
        if slots[0] < 0 or slots[-1] >= self._top or (self._counts[slots] < drops).any():
            bad = (slots < 0) | (slots >= self._top)
            bad |= ~bad & (self._counts[np.clip(slots, 0, max(self._top - 1, 0))] < drops)
            raise ValueError(UNKNOWN_HANDLE.format(handle=int(slots[bad][0])))
        self._counts[slots] -= drops
        for slot in slots[self._counts[slots] == 0].tolist():
            key = int(self._hashes[slot])
            held = self._index[key]
            held.remove(slot)
            if not held:
                del self._index[key]
            self._free.append(slot)
            self._held -= 1

    def gather(self, handles: np.ndarray) -> np.ndarray:
        """The frames of `handles` (any shape): `handles.shape + frame shape`."""
        assert self._frames is not None
        return np.take(self._frames, handles, axis=0)

    def recount(self, handles: np.ndarray, like: np.ndarray) -> None:
        """Takes `handles` (any shape) as every reference there is: each frame's count its occurrences.

        For frames that outlive the pool (a storage's rows of handles, and its `frames`): a slot no handle
        holds is free. A new pool (no `frames` given) is first given `like`, the all-zero frame, as handle 0:
        the handle of rows never written.

        Raises:
          ValueError: If a handle is not a slot of the pool (rows and frames that do not belong together).
        """
        if self._frames is None:
            self._allocate(like, max(self._capacity_hint, 1))
        assert self._frames is not None
        flat = np.asarray(handles, np.int64).ravel()
        if flat.size and (flat.min() < 0 or flat.max() >= len(self._frames)):
            bad = flat[(flat < 0) | (flat >= len(self._frames))][0]
            raise ValueError(UNKNOWN_HANDLE.format(handle=int(bad)))
        self._counts = np.bincount(flat, minlength=len(self._frames)).astype(np.int64)
        held = np.flatnonzero(self._counts)
        self._top = int(held[-1]) + 1 if held.size else 0
        self._free = np.flatnonzero(self._counts[: self._top] == 0)[::-1].tolist()  # popped lowest first
        self._index = {}
        for slot in held.tolist():
            key = _frame_hash(self._frames[slot].tobytes())
            self._hashes[slot] = key
            self._index.setdefault(key, []).append(slot)
        self._held = int(held.size)

    def _allocate(self, like: np.ndarray, slots: int) -> None:
        if self._given is not None:
            self._frames = self._given
        else:
            self._frames = np.zeros((slots, *like.shape), like.dtype)  # calloc: pages touched when written
        self._counts = np.zeros(len(self._frames), np.int64)
        self._hashes = np.zeros(len(self._frames), np.int64)

    def _new_slot(self) -> int:
        if self._free:
            return self._free.pop()
        assert self._frames is not None
        if self._top == len(self._frames) and self._given is not None:
            raise RuntimeError(f"frames: all {self._top} slots of the storage's pool are held")  # sized never to be
        if self._top == len(self._frames):  # grow by half: the untouched part costs no memory
            grown = len(self._frames) + len(self._frames) // 2 + 1
            frames = np.zeros((grown, *self._frames.shape[1:]), self._frames.dtype)
            frames[: self._top] = self._frames[: self._top]
            self._frames = frames
            self._counts = np.concatenate([self._counts, np.zeros(grown - self._top, np.int64)])
            self._hashes = np.concatenate([self._hashes, np.zeros(grown - self._top, np.int64)])
        self._top += 1
        return self._top - 1
