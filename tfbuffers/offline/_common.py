"""What the RLDS and Minari conversions share: messages, the episodes a buffer holds, and the filler that adds them."""

from __future__ import annotations

import collections.abc
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tfbuffers import kinds, specs

# Every extra the conversions use, imported here first: a missing one is reported once, naming the extras.
try:
    import gymnasium  # noqa: F401
    import tensorflow_datasets as tfds  # noqa: F401
    import tqdm
    from tensorflow_datasets.rlds import rlds_base  # noqa: F401
    from tf_agents.trajectories import trajectory as trajectory_lib
except ImportError as error:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        f"tfbuffers.offline needs tensorflow-datasets, minari, gymnasium and tf-agents ({error}): "
        "pip install 'tfbuffers[offline,agents]'"
    ) from error


FIRST, MID, LAST = 0, 1, 2
"""TF-Agents' step types."""


PROGRESS_DELAY_SECONDS = 2.0


CHECKED_BYTES = 256 * 2**20
"""The episodes `from_rlds` and `from_minari` keep between checking them and adding them: past this many bytes,
they are dropped once checked and read a second time to be added."""


RLDS_NAME = "tfbuffers_episodes"
"""The TFDS dataset name `to_rlds` writes by default."""


RLDS_SPLIT = "train"


RLDS_FIELDS = ("observation", "action", "reward", "discount", "policy_info")
"""The step fields that `from_rlds` reads (`discount` and `policy_info` where present)."""


MINARI_INFOS = ("discount", "policy_info", "last_action", "last_reward")
"""The `infos` entries that `to_minari` writes and `from_minari` reads."""


NOT_A_TRAJECTORY = (
    "buffer.data_spec: expected a tf_agents Trajectory spec (step types mark the episodes), got {received}"
)


NOT_EPISODES = (
    "episodes: expected a tf.data.Dataset of RLDS episodes (each a dict holding a 'steps' dataset) or a TFDS "
    "directory, got {received}"
)


NO_FLAGS = "steps/{key}: expected the RLDS episode flag (a bool scalar), got {received}"


MISSING_FIELD = "{path}: expected a field matching the buffer's {field} ({expected}), got none"


WRONG_FIELD = "{path}: expected {expected} (the buffer's {field}), got {received}"


BAD_FLAGS = (
    "episode {episode}, step {step}: expected {expected} (RLDS: is_first on the first step only, is_last on the "
    "last only, is_terminal only with is_last), got is_first={is_first}, is_last={is_last}, "
    "is_terminal={is_terminal}"
)


TOO_SHORT = "episode {episode}: expected at least 2 steps (a first and a last observation), got {received}"


BAD_ENDS = (
    "episode {episode}: expected terminations and truncations only on its last step {last}, got terminations at "
    "{terminations} and truncations at {truncations}"
)


BAD_INFO = "episode {episode}, infos[{key!r}]: expected {expected}, got {received}"


NOT_SUPPORTED = "{path}: expected a tensor spec or a dict of them ({what}), got {received}"


NOT_A_SPACE_SPEC = "{path}: expected a numeric or boolean spec (a gymnasium Box or Discrete), got dtype {received}"


LEFT_OUT = (
    "{frames} frames of {episodes} episodes were left out: the buffer's {batch_size} segments fill one frame each "
    "per add, and the segments' episodes ended at different adds (fill a buffer of batch_size=1 to keep every frame)"
)


class Converted(NamedTuple):
    """What a conversion moved."""

    episodes: int
    """Whole episodes written (or added)."""
    frames: int
    """Their frames."""
    left_out_frames: int
    """Frames not written: partial episodes (writing), or past the last full add (filling)."""


# The frames of one episode: one array per field of `buffer.fields`, each [frames, ...].
Episode = list[np.ndarray]


def trajectory_spec(buffer: Any) -> Any:
    spec = specs.unwrap(buffer.data_spec)
    if not isinstance(spec, trajectory_lib.Trajectory):
        raise TypeError(NOT_A_TRAJECTORY.format(received=type(spec).__name__))
    return spec


def role_of(path: str) -> str:
    """The Trajectory field a buffer field belongs to (`observation/pixels` -> `observation`)."""
    return path.split("/", 1)[0]


def describe(dtype: Any, shape: Sequence[int]) -> str:
    return f"{tf.as_dtype(dtype).name} {list(shape)}"


def progress_bar(progress: bool | None, total: int | None, description: str) -> Any:
    if progress is False:
        return None
    delay = 0.0 if progress else PROGRESS_DELAY_SECONDS
    return tqdm.tqdm(total=total, desc=description, unit="episode", delay=delay, leave=False)


def lookup_field(nest: Any, keys: Sequence[str]) -> Any:
    """`nest[keys[0]][keys[1]]...`, or None where a key is missing."""
    for key in keys:
        if isinstance(nest, collections.abc.Mapping):
            if key not in nest:
                return None
            nest = nest[key]
        elif isinstance(nest, tuple) and hasattr(nest, "_fields"):
            nest = getattr(nest, key, None)
        elif isinstance(nest, (list, tuple)) and key.isdigit() and int(key) < len(nest):
            nest = nest[int(key)]
        else:
            return None
        if nest is None:
            return None
    return nest


def _segments(buffer: Any) -> Iterator[list[np.ndarray]]:
    """Each segment's frames, oldest first, one array per field."""
    if hasattr(buffer, "gather_segment"):  # RayReplayBuffer: segments may hold different counts
        for segment in range(buffer.batch_size):
            yield [np.asarray(leaf) for leaf in tf.nest.flatten(buffer.gather_segment(segment))]
        return
    leaves = [np.asarray(leaf) for leaf in tf.nest.flatten(buffer.gather_all())]
    for segment in range(buffer.batch_size):
        yield [leaf[segment] for leaf in leaves]


def _complete_episodes(step_types: np.ndarray) -> list[tuple[int, int]]:
    """(first, stop) of each run from a FIRST frame to its LAST frame with no FIRST between."""
    firsts = np.flatnonzero(step_types == FIRST)
    lasts = np.flatnonzero(step_types == LAST)
    runs = []
    for index, first in enumerate(firsts):
        position = np.searchsorted(lasts, first)
        if position == len(lasts):
            break
        last = int(lasts[position])
        if index + 1 < len(firsts) and firsts[index + 1] < last:
            continue  # an episode cut short: a FIRST before its LAST
        runs.append((int(first), last + 1))
    return runs


def stored_episodes(buffer: Any) -> tuple[list[Episode], int]:
    """The buffer's complete episodes, oldest first, and how many frames were left out (see the module docstring).

    Each episode is one array per field of `buffer.fields`, `[frames, ...]`, in a
    TF-Agents driver's layout: FIRST, MID..., LAST.

    Raises:
      TypeError: If the buffer's frames are not TF-Agents `Trajectory` frames.
    """
    trajectory_spec(buffer)
    step_field = [field.path for field in buffer.fields].index("step_type")
    found: list[tuple[int, int, Episode]] = []
    left_out = 0
    for segment, leaves in enumerate(_segments(buffer)):
        runs = _complete_episodes(leaves[step_field])
        left_out += len(leaves[step_field]) - sum(stop - first for first, stop in runs)
        found.extend((first, segment, [leaf[first:stop] for leaf in leaves]) for first, stop in runs)
    found.sort(key=lambda entry: (entry[0], entry[1]))
    return [episode for _, _, episode in found], left_out


def ends_by_termination(fields: Sequence[specs.Field], episode: Episode) -> bool:
    discount = episode[[field.path for field in fields].index("discount")]
    return bool(discount[-2] == 0)


class Filler:
    """Deals episodes to segments and adds their frames in blocks of columns (one frame per segment each).

    A host buffer takes each block in one `extend`; a TF buffer's adds run in one `tf.function` call per block
    (a loop of `add_batch`: its blocks' lengths vary, and `extend` would be traced again for each).
    """

    CHUNK = 256

    def __init__(self, buffer: Any) -> None:
        self._buffer = buffer
        self._fields = buffer.fields
        self._batch_size = buffer.batch_size
        self._pending: list[list[Episode]] = [[] for _ in range(self._batch_size)]
        self._queued = np.zeros(self._batch_size, np.int64)  # frames dealt and not yet added, per segment
        self._dealt = 0
        self.frames = 0
        kind = kinds.BY_CLASS.get(type(buffer).__name__)
        self._add = self._graph_adder() if kind is not None and not kind.host else self._host_adder()

    def _host_adder(self) -> Any:
        pack = specs.packer(specs.unwrap(self._buffer.data_spec))

        def add(*leaves: np.ndarray) -> None:  # time-major columns: one block of them (`extend`)
            self._buffer.extend(pack([np.swapaxes(leaf, 0, 1) for leaf in leaves]))

        return add

    def _graph_adder(self) -> Any:
        """One `tf.function` call adds a chunk of columns: a call per add would cost more than the add."""
        pack = specs.packer(specs.unwrap(self._buffer.data_spec))
        signature = [
            tf.TensorSpec([None, self._batch_size, *field.spec.shape], field.spec.dtype) for field in self._fields
        ]

        @tf.function(input_signature=signature)
        def add(*leaves: tf.Tensor) -> None:
            for column in tf.range(tf.shape(leaves[0])[0]):
                self._buffer.add_batch(pack([leaf[column] for leaf in leaves]))

        return add

    def put(self, episode: Episode) -> None:
        segment = int(np.argmin(self._queued))
        length = len(episode[0])
        self._pending[segment].append(episode)
        self._queued[segment] += length
        self._dealt += 1
        if self._queued.min() >= self.CHUNK:
            self._flush(int(self._queued.min()))

    def _take(self, segment: int, count: int) -> list[np.ndarray]:
        """The next `count` frames of a segment's queue, one array per field."""
        taken: list[list[np.ndarray]] = [[] for _ in self._fields]
        pending = self._pending[segment]
        while count:
            episode = pending[0]
            length = len(episode[0])
            used = min(length, count)
            for index, leaf in enumerate(episode):
                taken[index].append(leaf[:used])
            if used == length:
                pending.pop(0)
            else:
                pending[0] = [leaf[used:] for leaf in episode]
            count -= used
        return [np.concatenate(parts) for parts in taken]

    def _flush(self, count: int) -> None:
        columns = [self._take(segment, count) for segment in range(self._batch_size)]
        self._queued -= count
        leaves = [np.stack([columns[segment][index] for segment in range(self._batch_size)], axis=1)
                  for index in range(len(self._fields))]  # fmt: skip
        for start in range(0, count, self.CHUNK):
            self._add(*[leaf[start : start + self.CHUNK] for leaf in leaves])
        self.frames += count * self._batch_size

    def close(self) -> Converted:
        """Adds what every segment can take at once, and says what was added and left out."""
        if self._queued.min() > 0:
            self._flush(int(self._queued.min()))
        left_out_frames = int(self._queued.sum())
        left_out_episodes = sum(len(pending) for pending in self._pending)
        whole = self._dealt - left_out_episodes
        if left_out_frames:
            warnings.warn(
                LEFT_OUT.format(frames=left_out_frames, episodes=left_out_episodes, batch_size=self._batch_size),
                stacklevel=4,  # the caller of from_rlds / from_minari (through fill)
            )
        return Converted(whole, self.frames, left_out_frames)


def fill(
    buffer: Any, read: Callable[[], Iterable[Episode]], total: int | None, what: str, progress: bool | None
) -> Converted:
    """Adds the episodes `read()` gives, all or none: every one is read and checked before the first add.

    `read()` converts each episode to the buffer's fields and raises, naming the
    episode, on one it refuses, so a refusal leaves the buffer as it was. Up to
    `CHECKED_BYTES` the checked episodes are kept for the adds; past it `read()`
    is called again (a dataset read twice must give the same episodes).
    """
    kept: list[Episode] | None = []
    size = 0
    bar = progress_bar(progress, total, f"checking {what}")
    try:
        for episode in read():
            size += sum(leaf.nbytes for leaf in episode)
            if kept is not None and size <= CHECKED_BYTES:
                kept.append(episode)
            else:
                kept = None
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    filler = Filler(buffer)
    bar = progress_bar(progress, total, f"adding {what}")
    try:
        for episode in read() if kept is None else kept:
            filler.put(episode)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return filler.close()


def episode_step_types(length: int) -> tuple[np.ndarray, np.ndarray]:
    step_type = np.full(length, MID, np.int32)
    step_type[0], step_type[-1] = FIRST, LAST
    next_step_type = np.concatenate([step_type[1:], [FIRST]]).astype(np.int32)
    return step_type, next_step_type


def check_step_spec(step_spec: Any, fields: Sequence[specs.Field]) -> None:
    """Refuses steps whose fields differ from the buffer's; the step types are made from the flags."""
    for key in ("is_first", "is_last"):
        flag = step_spec.get(key) if isinstance(step_spec, Mapping) else None
        if not isinstance(flag, tf.TensorSpec) or flag.dtype != tf.bool or flag.shape != ():
            received = "none" if flag is None else str(flag)
            raise ValueError(NO_FLAGS.format(key=key, received=received))
    for field in fields:
        role = role_of(field.path)
        if role in ("step_type", "next_step_type"):
            continue
        source = lookup_field(step_spec, field.path.split("/"))
        if source is None:
            if role == "discount":
                continue  # made from is_terminal
            raise ValueError(
                MISSING_FIELD.format(
                    path=f"steps/{field.path}", field=field.path,
                    expected=describe(field.spec.dtype, field.spec.shape),
                )
            )  # fmt: skip
        if not isinstance(source, tf.TensorSpec) or (source.dtype, source.shape) != (
            field.spec.dtype,
            field.spec.shape,
        ):
            received = (
                describe(source.dtype, source.shape) if isinstance(source, tf.TensorSpec) else type(source).__name__
            )
            raise ValueError(
                WRONG_FIELD.format(
                    path=f"steps/{field.path}", field=field.path,
                    expected=describe(field.spec.dtype, field.spec.shape), received=received,
                )
            )  # fmt: skip


def check_flags(index: int, is_first: np.ndarray, is_last: np.ndarray, is_terminal: np.ndarray) -> None:
    length = len(is_first)
    if length < 2:
        raise ValueError(TOO_SHORT.format(episode=index, received=length))
    ends = np.arange(length) == length - 1
    expected_first = np.arange(length) == 0
    wrong = (is_first != expected_first) | (is_last != ends) | (is_terminal & ~ends)
    if wrong.any():
        step = int(np.argmax(wrong))
        expected = ("is_first" if step == 0 else "not is_first") + (", is_last" if ends[step] else ", not is_last")
        raise ValueError(
            BAD_FLAGS.format(
                episode=index, step=step, expected=expected, is_first=bool(is_first[step]),
                is_last=bool(is_last[step]), is_terminal=bool(is_terminal[step]),
            )
        )  # fmt: skip
