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
  dataset without them, discounts are 0 on a terminated step (one that is
  both terminated and truncated, as gymnasium's `TimeLimit` reports a terminal
  state reached on the limit's last step, terminated) and 1 elsewhere,
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

Filling is all or nothing: every episode is read and checked first (its flags,
fields, dtypes and shapes), and only then are its frames added, so a refused
dataset leaves the buffer exactly as it was. The checked episodes are kept in
memory up to `CHECKED_BYTES` (256 MiB); a larger dataset is read a second time
to be added. The frames go in through `extend` (blocks of 256 adds; a TF buffer's
through `add_batch` in one `tf.function` call per block), so the buffer checks them
as it checks any add. A buffer of several segments gets each
episode whole in one segment, the segment with the fewest frames so far, and
its adds fill every segment at once: the frames past the shortest segment's
end at the last add are left out, counted, and warned about. Fill a buffer of
`batch_size=1` to keep everything.

Every conversion takes `progress`: a tqdm bar of episodes once it has taken
`PROGRESS_DELAY_SECONDS` (None), from the start (True) or never (False).

Needs the `offline` and `agents` extras (`pip install 'tfbuffers[offline,agents]'`).
"""

from __future__ import annotations

from tfbuffers.offline._common import (
    BAD_ENDS,
    BAD_FLAGS,
    BAD_INFO,
    CHECKED_BYTES,
    FIRST,
    LAST,
    LEFT_OUT,
    MID,
    MINARI_INFOS,
    MISSING_FIELD,
    NO_FLAGS,
    NOT_A_SPACE_SPEC,
    NOT_A_TRAJECTORY,
    NOT_EPISODES,
    NOT_SUPPORTED,
    PROGRESS_DELAY_SECONDS,
    RLDS_FIELDS,
    RLDS_NAME,
    RLDS_SPLIT,
    TOO_SHORT,
    WRONG_FIELD,
    Converted,
    Episode,
    stored_episodes,
)
from tfbuffers.offline.minari_data import from_minari, to_minari
from tfbuffers.offline.rlds_data import from_rlds, to_rlds

__all__ = [
    "BAD_ENDS",
    "BAD_FLAGS",
    "BAD_INFO",
    "CHECKED_BYTES",
    "Converted",
    "Episode",
    "FIRST",
    "LAST",
    "LEFT_OUT",
    "MID",
    "MINARI_INFOS",
    "MISSING_FIELD",
    "NOT_A_SPACE_SPEC",
    "NOT_A_TRAJECTORY",
    "NOT_EPISODES",
    "NOT_SUPPORTED",
    "NO_FLAGS",
    "PROGRESS_DELAY_SECONDS",
    "RLDS_FIELDS",
    "RLDS_NAME",
    "RLDS_SPLIT",
    "TOO_SHORT",
    "WRONG_FIELD",
    "from_minari",
    "from_rlds",
    "stored_episodes",
    "to_minari",
    "to_rlds",
]
