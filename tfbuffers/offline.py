"""Offline datasets in and out: a buffer's episodes as RLDS or Minari datasets, and buffers filled from them.

A buffer of TF-Agents `Trajectory` frames holds episodes as `tfbuffers.envs` and
TF-Agents' drivers write them: a FIRST frame, MID frames and a LAST frame whose
`next_step_type` is FIRST. Frame `t` holds observation `o_t`, the action taken
there, and the reward and discount that action got; an episode that terminated
has discount 0 on the frame before its LAST one, a truncated one keeps its
discount there. The LAST frame's action, reward and discount belong to the
transition into the next episode, which nothing trains on (a driver stores
reward 0 and discount 1 there).

* **RLDS** (`to_rlds`, `from_rlds`): one RLDS step per frame (`observation`,
  `action`, `reward`, `discount`, `is_first` on FIRST, `is_last` on LAST,
  `is_terminal` on the LAST step of an episode that terminated), plus the frame's
  `policy_info` as a step field when the spec has one. `to_rlds` writes a TFDS
  dataset directory (through TFDS's `SequentialWriter`) that
  `tfds.builder_from_directory(directory)` opens (split `"train"`). `from_rlds` reads such a
  directory or any `tf.data.Dataset` of RLDS episodes (`{"steps": Dataset}`, as
  the TFDS catalog's D4RL, RL Unplugged and Robomimic datasets come), reading
  only the step fields above (others are not stored), and gives a terminal
  episode's last transition discount 0 where the dataset's `discount` (or its
  absence) says otherwise.
* **Minari** (`to_minari`, `from_minari`): one Minari step per frame but the
  LAST (Minari's observations are one longer than its actions), `terminations`
  and `truncations` set on the last step from that discount, the data in
  Minari's default HDF5 format. Minari has no place for the frames' discounts,
  `policy_info` or the LAST frame's action and reward, so `to_minari` keeps them
  in each episode's `infos` (`"discount"`, `"policy_info"`, `"last_action"`,
  `"last_reward"`) and `from_minari` reads them back when they are there. For a
  dataset without them, discounts are 0 on a terminated step and 1 elsewhere,
  and the LAST frame gets action 0 and reward 0. Minari stores rewards as
  gymnasium returns them (float64): they are cast to the reward spec's dtype,
  as `tfbuffers.envs` does when it collects.

So a round trip, buffer to either format and back into an empty buffer, gives
the same frames, field for field.

Writing keeps complete episodes only, oldest first (by the add that wrote their
FIRST frame, then by segment; in a `RayReplayBuffer`, whose segments fill apart,
by the FIRST frame's place in its segment): each segment's oldest episode, when the ring
has overwritten its start, and its newest, until its LAST frame is added, are
left out and counted (`Converted.left_out_frames`).

Filling adds every frame of every episode through `add_batch`, so the buffer
checks them as it checks any add. A buffer of several segments gets each
episode whole in one segment, the segment with the fewest frames so far, and
its adds fill every segment at once: the frames past the shortest segment's
end at the last add are left out, counted, and warned about. Fill a buffer of
`batch_size=1` to keep everything.

Every conversion takes `progress`: a tqdm bar of episodes once it has taken
`PROGRESS_DELAY_SECONDS` (None), from the start (True) or never (False).

Needs the `offline` and `agents` extras (`pip install 'tfbuffers[offline,agents]'`).
"""

from __future__ import annotations

import collections.abc
import itertools
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tfbuffers import kinds, specs

try:
    import gymnasium
    import tensorflow_datasets as tfds
    import tqdm
    from tensorflow_datasets.rlds import rlds_base
    from tf_agents.trajectories import trajectory as trajectory_lib
except ImportError as error:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        f"tfbuffers.offline needs tensorflow-datasets, minari, gymnasium and tf-agents ({error}): "
        "pip install 'tfbuffers[offline,agents]'"
    ) from error

FIRST, MID, LAST = 0, 1, 2
"""TF-Agents' step types."""
PROGRESS_DELAY_SECONDS = 2.0
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
    "episode {episode}: expected terminations and truncations only on its last step {last}, and not both there, "
    "got terminations at {terminations} and truncations at {truncations}"
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


def _trajectory_spec(buffer: Any) -> Any:
    spec = specs.unwrap(buffer.data_spec)
    if not isinstance(spec, trajectory_lib.Trajectory):
        raise TypeError(NOT_A_TRAJECTORY.format(received=type(spec).__name__))
    return spec


def _role(path: str) -> str:
    """The Trajectory field a buffer field belongs to (`observation/pixels` -> `observation`)."""
    return path.split("/", 1)[0]


def _describe(dtype: Any, shape: Sequence[int]) -> str:
    return f"{tf.as_dtype(dtype).name} {list(shape)}"


def _bar(progress: bool | None, total: int | None, description: str) -> Any:
    if progress is False:
        return None
    delay = 0.0 if progress else PROGRESS_DELAY_SECONDS
    return tqdm.tqdm(total=total, desc=description, unit="episode", delay=delay, leave=False)


def _lookup(nest: Any, keys: Sequence[str]) -> Any:
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


# Reading a buffer's episodes.


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
    _trajectory_spec(buffer)
    step_field = [field.path for field in buffer.fields].index("step_type")
    found: list[tuple[int, int, Episode]] = []
    left_out = 0
    for segment, leaves in enumerate(_segments(buffer)):
        runs = _complete_episodes(leaves[step_field])
        left_out += len(leaves[step_field]) - sum(stop - first for first, stop in runs)
        found.extend((first, segment, [leaf[first:stop] for leaf in leaves]) for first, stop in runs)
    found.sort(key=lambda entry: (entry[0], entry[1]))
    return [episode for _, _, episode in found], left_out


def _terminated(fields: Sequence[specs.Field], episode: Episode) -> bool:
    discount = episode[[field.path for field in fields].index("discount")]
    return bool(discount[-2] == 0)


# Filling a buffer.


class _Filler:
    """Deals episodes to segments and adds their frames a column (one frame per segment) at a time."""

    CHUNK = 256

    def __init__(self, buffer: Any) -> None:
        self._buffer = buffer
        self._fields = buffer.fields
        self._batch_size = buffer.batch_size
        self._pending: list[list[Episode]] = [[] for _ in range(self._batch_size)]
        self._queued = np.zeros(self._batch_size, np.int64)  # frames dealt and not yet added, per segment
        self._dealt = 0
        self.frames = 0
        self.result = Converted(0, 0, 0)
        kind = kinds.BY_CLASS.get(type(buffer).__name__)
        self._add = self._graph_adder() if kind is not None and not kind.host else self._host_adder()

    def _host_adder(self) -> Any:
        pack = specs.packer(specs.unwrap(self._buffer.data_spec))

        def add(*leaves: np.ndarray) -> None:
            for column in range(len(leaves[0])):
                self._buffer.add_batch(pack([leaf[column] for leaf in leaves]))

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

    def __enter__(self) -> _Filler:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        """Adds what every segment can take at once (also when a later episode was refused)."""
        self.result = self._close()

    def _close(self) -> Converted:
        if self._queued.min() > 0:
            self._flush(int(self._queued.min()))
        left_out_frames = int(self._queued.sum())
        left_out_episodes = sum(len(pending) for pending in self._pending)
        whole = self._dealt - left_out_episodes
        if left_out_frames:
            warnings.warn(
                LEFT_OUT.format(frames=left_out_frames, episodes=left_out_episodes, batch_size=self._batch_size),
                stacklevel=4,  # the caller of from_rlds / from_minari
            )
        return Converted(whole, self.frames, left_out_frames)


def _step_types(length: int) -> tuple[np.ndarray, np.ndarray]:
    step_type = np.full(length, MID, np.int32)
    step_type[0], step_type[-1] = FIRST, LAST
    next_step_type = np.concatenate([step_type[1:], [FIRST]]).astype(np.int32)
    return step_type, next_step_type


# RLDS.


def _feature(spec: Any, path: str) -> Any:
    if isinstance(spec, collections.abc.Mapping):
        return tfds.features.FeaturesDict({key: _feature(value, f"{path}/{key}") for key, value in spec.items()})
    if isinstance(spec, (list, tuple)):
        raise TypeError(NOT_SUPPORTED.format(path=path, what="TFDS features", received=type(spec).__name__))
    return tfds.features.Tensor(shape=tuple(spec.shape), dtype=tf.as_dtype(spec.dtype).as_numpy_dtype)


def to_rlds(
    buffer: Any,
    directory: str | os.PathLike,
    *,
    name: str = RLDS_NAME,
    episodes_per_shard: int = 1000,
    progress: bool | None = None,
) -> Converted:
    """Writes the buffer's complete episodes as an RLDS dataset in TFDS format (see the module docstring).

    >>> builder = tfds.builder_from_directory(directory)  # doctest: +SKIP
    >>> episodes = builder.as_dataset(split="train")  # doctest: +SKIP

    Args:
      buffer: Any buffer of `Trajectory` frames (`tfbuffers.observers` fill them).
      directory: Where the dataset's files go; it must not hold a dataset yet.
      name: The TFDS dataset name.
      episodes_per_shard: Episodes per TFRecord file.
      progress: A progress bar (see the module docstring).

    Returns:
      The episodes and frames written, and the frames of partial episodes left out.

    Raises:
      TypeError: If the frames are not `Trajectory` frames, or an observation,
        action or policy_info is a tuple (TFDS features are tensors and dicts).
      FileExistsError: If `directory` already holds a dataset.
    """
    spec = _trajectory_spec(buffer)
    directory = os.fspath(directory)
    if tf.io.gfile.exists(os.path.join(directory, "dataset_info.json")):
        raise FileExistsError(f"directory: expected a directory without a dataset, got {directory!r}")
    step_metadata = (
        {} if not tf.nest.flatten(spec.policy_info) else {"policy_info": _feature(spec.policy_info, "policy_info")}
    )
    config = rlds_base.DatasetConfig(
        name=name,
        observation_info=_feature(spec.observation, "observation"),
        action_info=_feature(spec.action, "action"),
        reward_info=_feature(spec.reward, "reward"),
        discount_info=_feature(spec.discount, "discount"),
        step_metadata_info=step_metadata,
    )
    identity = tfds.core.dataset_info.DatasetIdentity(
        name=name, version=tfds.core.Version("1.0.0"), data_dir=directory, module_name=__name__
    )
    tf.io.gfile.makedirs(directory)
    writer = tfds.core.SequentialWriter(
        ds_info=rlds_base.build_info(config, identity), max_examples_per_shard=episodes_per_shard
    )
    writer.initialize_splits([RLDS_SPLIT])
    episodes, left_out = stored_episodes(buffer)
    pack = specs.packer(spec)
    bar = _bar(progress, len(episodes), f"writing RLDS {name}")
    frames = 0
    for episode in episodes:
        frame = pack(episode)
        length = len(episode[0])
        steps = {
            "observation": frame.observation,
            "action": frame.action,
            "reward": frame.reward,
            "discount": frame.discount,
            "is_first": np.arange(length) == 0,
            "is_last": np.arange(length) == length - 1,
            "is_terminal": (np.arange(length) == length - 1) & _terminated(buffer.fields, episode),
        }
        if step_metadata:
            steps["policy_info"] = frame.policy_info
        writer.add_examples({RLDS_SPLIT: [{"steps": steps}]})
        frames += length
        if bar is not None:
            bar.update(1)
    writer.close_all()
    if bar is not None:
        bar.close()
    return Converted(len(episodes), frames, left_out)


def _check_step_spec(step_spec: Any, fields: Sequence[specs.Field]) -> None:
    """Refuses steps whose fields differ from the buffer's; the step types are made from the flags."""
    for key in ("is_first", "is_last"):
        flag = step_spec.get(key) if isinstance(step_spec, Mapping) else None
        if not isinstance(flag, tf.TensorSpec) or flag.dtype != tf.bool or flag.shape != ():
            received = "none" if flag is None else str(flag)
            raise ValueError(NO_FLAGS.format(key=key, received=received))
    for field in fields:
        role = _role(field.path)
        if role in ("step_type", "next_step_type"):
            continue
        source = _lookup(step_spec, field.path.split("/"))
        if source is None:
            if role == "discount":
                continue  # made from is_terminal
            raise ValueError(
                MISSING_FIELD.format(
                    path=f"steps/{field.path}", field=field.path,
                    expected=_describe(field.spec.dtype, field.spec.shape),
                )
            )  # fmt: skip
        if not isinstance(source, tf.TensorSpec) or (source.dtype, source.shape) != (
            field.spec.dtype,
            field.spec.shape,
        ):
            received = (
                _describe(source.dtype, source.shape) if isinstance(source, tf.TensorSpec) else type(source).__name__
            )
            raise ValueError(
                WRONG_FIELD.format(
                    path=f"steps/{field.path}", field=field.path,
                    expected=_describe(field.spec.dtype, field.spec.shape), received=received,
                )
            )  # fmt: skip


def _check_flags(index: int, is_first: np.ndarray, is_last: np.ndarray, is_terminal: np.ndarray) -> None:
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


def _rlds_frames(index: int, steps: Mapping[str, Any], fields: Sequence[specs.Field]) -> Episode:
    is_first, is_last = np.asarray(steps["is_first"]), np.asarray(steps["is_last"])
    is_terminal = np.asarray(steps.get("is_terminal", np.zeros_like(is_last)))
    _check_flags(index, is_first, is_last, is_terminal)
    length = len(is_first)
    step_type, next_step_type = _step_types(length)
    leaves = []
    for field in fields:
        role = _role(field.path)
        dtype = field.spec.dtype.as_numpy_dtype
        if role == "step_type":
            leaves.append(step_type)
        elif role == "next_step_type":
            leaves.append(next_step_type)
        else:
            value = _lookup(steps, field.path.split("/"))
            if role == "discount":
                value = np.ones(length, dtype) if value is None else np.array(value)
                if is_terminal[-1]:
                    value[-2] = 0
            leaves.append(np.asarray(value))
    return leaves


def _rlds_episodes(episodes: Any) -> tf.data.Dataset:
    if isinstance(episodes, (str, os.PathLike)):
        return tfds.builder_from_directory(os.fspath(episodes)).as_dataset(split=RLDS_SPLIT)
    if not isinstance(episodes, tf.data.Dataset) or not isinstance(episodes.element_spec, Mapping):
        raise TypeError(NOT_EPISODES.format(received=type(episodes).__name__))
    if "steps" not in episodes.element_spec:
        raise TypeError(NOT_EPISODES.format(received=f"episodes with keys {sorted(episodes.element_spec)}"))
    return episodes


def from_rlds(buffer: Any, episodes: Any, *, progress: bool | None = None) -> Converted:
    """Adds every episode of an RLDS dataset to the buffer (see the module docstring).

    Args:
      buffer: Any buffer of `Trajectory` frames (local or `RayReplayBuffer`).
      episodes: A `tf.data.Dataset` of RLDS episodes, as `tfds.load(...)` or
        `builder.as_dataset(split=...)` return them, or a directory `to_rlds`
        (or any TFDS writer) made, whose `"train"` split is read. Map the dataset
        first to convert fields whose dtype or shape differs from the buffer's:
        nothing is cast here.
      progress: A progress bar (see the module docstring).

    Returns:
      The episodes and frames added, and the frames left out (segments' ends).

    Raises:
      TypeError: If the buffer's frames are not `Trajectory` frames or
        `episodes` is not a dataset of RLDS episodes.
      ValueError: Naming the step field, before anything is added, if a field
        the buffer stores is missing from the steps or has another dtype or shape;
        naming the episode and step, when it is read, if its `is_first`,
        `is_last` and `is_terminal` do not delimit one episode of at least two
        steps (the episodes before it stay added).
    """
    _trajectory_spec(buffer)
    dataset = _rlds_episodes(episodes)
    steps_spec = dataset.element_spec["steps"]
    _check_step_spec(steps_spec.element_spec, buffer.fields)
    total = int(dataset.cardinality()) if int(dataset.cardinality()) >= 0 else None
    bar = _bar(progress, total, "adding RLDS episodes")
    filler = _Filler(buffer)
    steps = iter(dataset.map(lambda episode: episode["steps"].batch(2**31 - 1).get_single_element()))
    with filler:
        for index in itertools.count():
            try:
                episode = next(steps)
            except StopIteration:
                break
            except tf.errors.InvalidArgumentError as error:  # an episode of no steps: nothing to batch
                raise ValueError(TOO_SHORT.format(episode=index, received=0)) from error
            filler.put(_rlds_frames(index, tf.nest.map_structure(np.asarray, episode), buffer.fields))
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return filler.result


# Minari.


def _space(spec: Any, path: str) -> gymnasium.Space:
    """The gymnasium space of a spec nest; an int64 scalar with bounds is `Discrete`, as `tfbuffers.envs` reads it."""
    if isinstance(spec, collections.abc.Mapping):
        return gymnasium.spaces.Dict({key: _space(value, f"{path}/{key}") for key, value in spec.items()})
    if isinstance(spec, (list, tuple)):
        raise TypeError(NOT_SUPPORTED.format(path=path, what="Minari spaces", received=type(spec).__name__))
    dtype = tf.as_dtype(spec.dtype)
    if not (dtype.is_floating or dtype.is_integer) or dtype.is_complex:
        raise TypeError(NOT_A_SPACE_SPEC.format(path=path, received=dtype.name))
    bounded = hasattr(spec, "minimum") and hasattr(spec, "maximum")
    if bounded and dtype == tf.int64 and tuple(spec.shape) == ():
        start, stop = int(np.asarray(spec.minimum)), int(np.asarray(spec.maximum))
        return gymnasium.spaces.Discrete(stop - start + 1, start=start)
    numpy_dtype = dtype.as_numpy_dtype
    if bounded:
        low, high = np.asarray(spec.minimum), np.asarray(spec.maximum)
    elif dtype.is_floating:
        low, high = np.asarray(-np.inf), np.asarray(np.inf)
    else:
        low, high = np.asarray(np.iinfo(numpy_dtype).min), np.asarray(np.iinfo(numpy_dtype).max)
    shape = tuple(spec.shape)
    low, high = (np.broadcast_to(bound, shape).astype(numpy_dtype) for bound in (low, high))
    return gymnasium.spaces.Box(low, high, shape, numpy_dtype)


def to_minari(
    buffer: Any,
    dataset_id: str,
    *,
    env: Any = None,
    progress: bool | None = None,
    **metadata: Any,
) -> Converted:
    """Writes the buffer's complete episodes as a Minari dataset (see the module docstring).

    `minari.load_dataset(dataset_id)` opens it, from `MINARI_DATASETS_PATH` (or
    `~/.minari/datasets`), as for any Minari dataset.

    Args:
      buffer: Any buffer of `Trajectory` frames.
      dataset_id: Minari's id, `(namespace/)(env_name/)dataset_name-v(version)`.
      env: The environment that collected the frames, recorded for
        `dataset.recover_environment()`: a gymnasium environment, its id or
        `EnvSpec`, or a `tfbuffers.envs.GymnasiumEnvironment` (its gymnasium
        environment, with the keyword arguments it was made with). Without it
        the spaces come from the buffer's spec (a bounded int64 scalar becomes
        `Discrete`, anything else a `Box`).
      progress: A progress bar (see the module docstring).
      **metadata: Passed to `minari.create_dataset_from_buffers`: `author`,
        `author_email`, `algorithm_name`, `code_permalink`, `description`, ...

    Returns:
      The episodes and frames written, and the frames of partial episodes left out.

    Raises:
      TypeError: If the frames are not `Trajectory` frames, or an observation or
        action spec is a tuple or not numeric (no Minari space for it here).
      ValueError: From Minari, if a dataset with that id exists.
    """
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer

    spec = _trajectory_spec(buffer)
    env = getattr(env, "gymnasium_env", env)
    spaces = {}
    if env is None:
        spaces = {
            "observation_space": _space(spec.observation, "observation"),
            "action_space": _space(spec.action, "action"),
        }
    episodes, left_out = stored_episodes(buffer)
    pack = specs.packer(spec)
    bar = _bar(progress, len(episodes), f"writing Minari {dataset_id}")
    written, frames = [], 0
    for index, episode in enumerate(episodes):
        frame = pack(episode)
        length = len(episode[0])
        terminated = _terminated(buffer.fields, episode)
        ends = np.arange(length - 1) == length - 2
        infos = {
            "discount": frame.discount,
            "last_action": tf.nest.map_structure(lambda leaf: leaf[-1:], frame.action),
            "last_reward": frame.reward[-1:],
        }
        if tf.nest.flatten(spec.policy_info):
            infos["policy_info"] = frame.policy_info
        written.append(
            EpisodeBuffer(
                id=index,
                observations=frame.observation,
                actions=tf.nest.map_structure(lambda leaf: leaf[:-1], frame.action),
                rewards=frame.reward[:-1],
                terminations=ends & terminated,
                truncations=ends & (not terminated),
                infos=infos,
            )
        )
        frames += length
        if bar is not None:
            bar.update(1)
    minari.create_dataset_from_buffers(dataset_id, written, env=env, **spaces, **metadata)
    if bar is not None:
        bar.close()
    return Converted(len(episodes), frames, left_out)


def _check_spaces(dataset: Any, fields: Sequence[specs.Field]) -> None:
    from tfbuffers import envs

    space_specs = {
        "observation": envs.spec_from_space(dataset.observation_space, "observation_space"),
        "action": envs.spec_from_space(dataset.action_space, "action_space"),
    }
    for field in fields:
        role = _role(field.path)
        if role not in space_specs:
            continue
        keys = field.path.split("/")[1:]
        source = _lookup(space_specs[role], keys) if keys else space_specs[role]
        path = "/".join([f"{role}_space", *keys])
        expected = _describe(field.spec.dtype, field.spec.shape)
        if source is None:
            raise ValueError(MISSING_FIELD.format(path=path, field=field.path, expected=expected))
        if not hasattr(source, "dtype") or (tf.as_dtype(source.dtype), tuple(source.shape)) != (
            field.spec.dtype,
            tuple(field.spec.shape),
        ):
            received = _describe(source.dtype, source.shape) if hasattr(source, "dtype") else type(source).__name__
            raise ValueError(WRONG_FIELD.format(path=path, field=field.path, expected=expected, received=received))


def _info(index: int, infos: Mapping[str, Any], key: str, keys: Sequence[str], spec: tf.TensorSpec, length: int) -> Any:
    value = _lookup(infos.get(key), keys) if keys else infos.get(key)
    if value is None:
        return None
    value = np.asarray(value)
    expected = (length, *spec.shape)
    if value.dtype != spec.dtype.as_numpy_dtype or value.shape != expected:
        raise ValueError(
            BAD_INFO.format(
                episode=index, key="/".join([key, *keys]), expected=_describe(spec.dtype, expected),
                received=_describe(value.dtype, value.shape),
            )
        )  # fmt: skip
    return value


def _minari_frames(episode: Any, fields: Sequence[specs.Field]) -> Episode:
    steps = len(episode.rewards)
    terminations, truncations = np.asarray(episode.terminations, bool), np.asarray(episode.truncations, bool)
    last = steps - 1
    if steps < 1 or terminations[:last].any() or truncations[:last].any() or (terminations[last] and truncations[last]):
        raise ValueError(
            BAD_ENDS.format(
                episode=episode.id, last=last, terminations=np.flatnonzero(terminations).tolist(),
                truncations=np.flatnonzero(truncations).tolist(),
            )
        )  # fmt: skip
    length = steps + 1
    step_type, next_step_type = _step_types(length)
    infos = episode.infos or {}
    leaves = []
    for field in fields:
        role, keys = _role(field.path), field.path.split("/")[1:]
        dtype = field.spec.dtype.as_numpy_dtype
        if role == "step_type":
            leaves.append(step_type)
        elif role == "next_step_type":
            leaves.append(next_step_type)
        elif role == "observation":
            leaves.append(np.asarray(_lookup(episode.observations, keys) if keys else episode.observations))
        elif role == "action":
            actions = np.asarray(_lookup(episode.actions, keys) if keys else episode.actions)
            last_action = _info(episode.id, infos, "last_action", keys, field.spec, 1)
            leaves.append(np.concatenate([actions, np.zeros_like(actions[:1]) if last_action is None else last_action]))
        elif role == "reward":
            last_reward = _info(episode.id, infos, "last_reward", keys, field.spec, 1)
            rewards = np.asarray(episode.rewards).astype(dtype)  # gymnasium's float64 rewards (module docstring)
            leaves.append(np.concatenate([rewards, np.zeros(1, dtype) if last_reward is None else last_reward]))
        elif role == "discount":
            discount = _info(episode.id, infos, "discount", keys, field.spec, length)
            if discount is None:
                discount = np.ones(length, dtype)
                discount[-2] = 0 if terminations[last] else 1
            leaves.append(discount)
        else:  # policy_info
            value = _info(episode.id, infos, "policy_info", keys, field.spec, length)
            if value is None:
                raise ValueError(
                    MISSING_FIELD.format(
                        path=f"episode {episode.id} infos/{field.path}", field=field.path,
                        expected=_describe(field.spec.dtype, field.spec.shape),
                    )
                )  # fmt: skip
            leaves.append(value)
    return leaves


def from_minari(buffer: Any, dataset: Any, *, progress: bool | None = None) -> Converted:
    """Adds every episode of a Minari dataset to the buffer (see the module docstring).

    Args:
      buffer: Any buffer of `Trajectory` frames (local or `RayReplayBuffer`).
      dataset: A `minari.MinariDataset` (`minari.load_dataset(id)`) or its id.
      progress: A progress bar (see the module docstring).

    Returns:
      The episodes and frames added, and the frames left out (segments' ends).

    Raises:
      TypeError: If the buffer's frames are not `Trajectory` frames.
      ValueError: Naming the space, before anything is added, if the dataset's
        observation or action space differs from the buffer's spec in structure,
        dtype or shape; naming the episode, when it is read, if it ends before
        its last step, or its `infos` carry a discount, last action, last reward
        or policy_info of another dtype or shape (the episodes before it stay added).
    """
    import minari

    _trajectory_spec(buffer)
    if isinstance(dataset, str):
        dataset = minari.load_dataset(dataset)
    _check_spaces(dataset, buffer.fields)
    bar = _bar(progress, dataset.total_episodes, "adding Minari episodes")
    filler = _Filler(buffer)
    with filler:
        for episode in dataset.iterate_episodes():
            filler.put(_minari_frames(episode, buffer.fields))
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return filler.result
