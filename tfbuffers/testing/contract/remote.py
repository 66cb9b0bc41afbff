"""The contract's kinds of the remote buffers: Reverb's table and Ray's actor, with the cases each cannot support.

`REVERB_KIND` (on a stack where dm-reverb imports) and `RAY_KIND` (where Ray does) run the contract as the local
kinds do; the cases their design does not support are skipped with the reason (`REVERB_SKIPS`, `RAY_SKIPS`):
the Reverb buffer stores items, not a ring, and the Ray buffer's frames are read by draws only.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

import tfbuffers
import tfbuffers.kinds
from tfbuffers.testing.contract import BufferKind, from_registry


class FlushingReverbReplayBuffer(tfbuffers.ReverbReplayBuffer):
    """`ReverbReplayBuffer` whose adds are in the table when `add_batch` returns, for the contract suite.

    Reverb's writers send items when they flush (at an episode's end, `flush()`, `close()`); the contract
    samples right after adding, as a program does once it flushed. Eagerly and inside `tf.function` alike:
    a graph's add runs the eager one when the graph runs (`tfbuffers.execution.host`).
    """

    def _add_batch(self, leaves: Any, deferred: Any) -> Any:
        ids = super()._add_batch(leaves, deferred)
        if tf.executing_eagerly():
            self.flush()
        return ids


def _reverb(spec: Any, batch_size: int, max_length: int, **options: Any) -> tfbuffers.ReverbReplayBuffer:
    """A Reverb buffer of the contract's sizes: items of `max_length` frames (its longest windows), as many items."""
    options.pop("seed", None)  # Reverb's server draws; it takes no seed
    return FlushingReverbReplayBuffer(
        spec, sequence_length=max_length, batch_size=batch_size, capacity=batch_size * max_length, **options
    )


_REVERB_IDS = (
    "Reverb: BufferInfo.ids are its items' keys and add_batch returns each environment's count of frames, not "
    "the ring's frame ids (tests/remote/reverb_replay_buffer_test.py checks what they are)"
)
_REVERB_ORDER = (
    "Reverb: a table has no order to read: gather_all, sample_all, indices, epochs and the deterministic pass "
    "are refused"
)
_REVERB_ITEMS = (
    "Reverb: a table holds items (windows of sequence_length frames, made once an environment has that many), "
    "removed oldest first across environments: num_frames, len, size and full count items, not frames"
)
_REVERB_LAYOUT = (
    "Reverb: no segments of max_length frames (its windows are sequence_length long) and no ring options "
    "(stateful_dataset, dataset_window_shift, dataset_drop_remainder)"
)
# The contract's cases the Reverb buffer does not support, by test function, and why. Every other case runs on it.
REVERB_SKIPS = {
    "test_is_a_replay_buffer": _REVERB_LAYOUT,
    "test_adds_before_wrap": _REVERB_IDS,
    "test_adds_wrap_around": _REVERB_ORDER,
    "test_single_frames_come_from_the_stored_frames": _REVERB_IDS,
    "test_probabilities_are_uniform_over_stored_windows": _REVERB_ITEMS,
    "test_windows_stay_in_one_segment_and_in_time": _REVERB_IDS,
    "test_window_of_max_length_is_the_whole_segment": _REVERB_ITEMS,
    "test_unbatched_and_unstacked_samples": _REVERB_ITEMS,
    "test_sampling_too_few_frames_raises": (
        "Reverb: an emptier table than min_size_to_sample is refused naming the table and the items it needs; "
        "num_steps is checked against sequence_length"
    ),
    "test_random_dataset_has_static_specs_and_sees_new_data": _REVERB_IDS,
    "test_parallel_random_dataset": _REVERB_ITEMS,
    "test_deterministic_pass_after_wrap_visits_every_frame_once": _REVERB_ORDER,
    "test_deterministic_windows_never_mix_segments": _REVERB_ORDER,
    "test_deterministic_windows_with_shift_one": _REVERB_ORDER,
    "test_deterministic_batched_pass": _REVERB_ORDER,
    "test_deterministic_pass_drop_remainder": _REVERB_ORDER,
    "test_deterministic_pass_reads_the_buffer_when_iterated": _REVERB_ORDER,
    "test_sequence_preprocess_fn_is_applied": _REVERB_ITEMS,
    "test_clear": _REVERB_ORDER,
    "test_checkpoint_round_trip": (
        "Reverb: its server checkpoints the table (py_client.checkpoint, ReplayBufferManager), not tf.train.Checkpoint"
    ),
    "test_bad_batches_are_rejected_and_change_nothing": _REVERB_ORDER,
    "test_bad_blocks_are_rejected_and_change_nothing": _REVERB_ORDER,
    "test_extend_is_the_adds_one_by_one": _REVERB_ORDER,
    "test_exact_python_values_are_accepted": _REVERB_ORDER,
    "test_bad_sampling_arguments": _REVERB_ITEMS,
    "test_list_specs_come_back_as_tuples_from_datasets": _REVERB_ITEMS,
    "test_a_refused_add_inside_a_graph_leaves_the_buffer_working": _REVERB_ORDER,
    "test_reads_inside_a_graph_run_when_the_graph_runs": _REVERB_ORDER,
    "test_stateful_dataset_is_accepted_and_changes_nothing": _REVERB_LAYOUT,
    "test_size_and_len_count_stored_frames": _REVERB_ITEMS,
    "test_len_size_and_full": _REVERB_ITEMS,
    "test_sample_all_and_indices_are_oldest_first_by_id": _REVERB_ORDER,
    "test_an_index_out_of_range_is_refused_and_the_buffer_works_on": _REVERB_ORDER,
    "test_an_epoch_visits_every_window_once_in_random_order": _REVERB_ORDER,
    "test_an_epoch_of_an_empty_buffer_is_empty_and_arguments_are_checked": _REVERB_ORDER,
    "test_construction_from_a_config": (
        "Reverb: no from_config; tfbuffers.ReplayBufferManager records a Reverb buffer's configuration"
    ),
}

_RAY_ORDER = (
    "Ray: an actor's segments are read by draws and gather_all only: no deterministic pass, epochs or random "
    "access by index (sample_all, get_item, sample_by_index)"
)
# The contract's cases the Ray buffer does not support, by test function, and why. Every other case runs on it, on a
# real local cluster, on its default layout (elastic: the segments share one storage, oldest frames out).
RAY_SKIPS = {
    "test_sampling_too_few_frames_raises": (
        "Ray: its refusals name the actor (RayReplayBuffer 'name' is empty ...), for a learner that reads several; "
        "tests/remote/ray_replay_buffer_test.py checks them"
    ),
    "test_random_dataset_has_static_specs_and_sees_new_data": (
        "Ray: as_dataset fetches the next windows from the actor while the last ones are read (prefetch_items), so "
        "an element can predate the adds made just before it is asked for"
    ),
    "test_deterministic_pass_after_wrap_visits_every_frame_once": _RAY_ORDER,
    "test_deterministic_windows_never_mix_segments": _RAY_ORDER,
    "test_deterministic_windows_with_shift_one": _RAY_ORDER,
    "test_deterministic_batched_pass": _RAY_ORDER,
    "test_deterministic_pass_drop_remainder": _RAY_ORDER,
    "test_deterministic_pass_reads_the_buffer_when_iterated": _RAY_ORDER,
    "test_reads_inside_a_graph_run_when_the_graph_runs": _RAY_ORDER,
    "test_sample_all_and_indices_are_oldest_first_by_id": _RAY_ORDER,
    "test_an_index_out_of_range_is_refused_and_the_buffer_works_on": _RAY_ORDER,
    "test_an_epoch_visits_every_window_once_in_random_order": _RAY_ORDER,
    "test_an_epoch_of_an_empty_buffer_is_empty_and_arguments_are_checked": _RAY_ORDER,
    "test_checkpoint_round_trip": (
        "Ray: the actor's frames are saved by save/load (and kept by directory=), not tf.train.Checkpoint: the "
        "client holds no variables"
    ),
    "test_stateful_dataset_is_accepted_and_changes_nothing": (
        "Ray: no stateful_dataset (TF-Agents' flag, which the local buffers accept and ignore; the Ray buffer is no "
        "TF-Agents class)"
    ),
    "test_construction_from_a_config": (
        "Ray: no from_config; its constructor, RayReplayBuffer.load/open and ReplayBufferManager(backend='ray') "
        "make one"
    ),
}


REVERB_KIND = BufferKind("reverb", _reverb, buffer_class=tfbuffers.ReverbReplayBuffer, skips=REVERB_SKIPS)
"""A Reverb buffer on an embedded server whose adds are in the table when `add_batch` returns."""
RAY_KIND = BufferKind(
    "ray",
    from_registry(tfbuffers.kinds.REMOTE_KINDS["ray_uniform"]),
    buffer_class=tfbuffers.RayReplayBuffer,
    skips=RAY_SKIPS,
)
"""A Ray buffer, on a local cluster the first one starts."""
