"""The server side of the Reverb buffer: its tables, rate limiters, and servers started in process.

`make_table` and `make_rate_limiter` build what `ReverbReplayBuffer` creates on its embedded server, so a
standalone server (`scripts/replay_server.py`) serves the same table; `served_sampler` and
`check_served_table` read what a running server serves before a buffer writes to it.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfbuffers import _noise, specs
from tfbuffers.remote.options import check_ratio

NO_REVERB = (
    "ReverbReplayBuffer needs dm-reverb, which could not be imported ({error}); it installs on Python 3.11 "
    "with tensorflow 2.15: pip install -c constraints.txt -e '.[reverb]'"
)
NO_TABLE = "table_name: the server at {address} has no table {table!r}; it serves {tables}"
OTHER_SIGNATURE = (
    "data_spec, sequence_length: table {table!r} at {address} stores items {served}; this buffer's items, windows "
    "of {sequence_length} frames of its data_spec, are {requested}. Give the spec and sequence_length the server "
    "was started with"
)


def import_reverb() -> Any:
    """The `reverb` module, or an ImportError that says how to install it."""
    try:
        import reverb
    except ImportError as error:  # another platform or Python
        raise ImportError(NO_REVERB.format(error=error)) from error
    return reverb


def check_served_table(client: Any, address: str, table_name: str, signature: Any, sequence_length: int) -> None:
    """Refuses a running server's table whose items are not windows of `signature` (before any add).

    Raises:
      ValueError: If the server has no table `table_name`, or its items have other fields, shapes or dtypes;
        the message names both sides.
    """
    tables = client.server_info()
    if table_name not in tables:
        raise ValueError(NO_TABLE.format(address=address, table=table_name, tables=sorted(tables)))
    served = tables[table_name].signature

    def layout(nest: Any) -> Any:
        fields = specs.flatten_spec(nest)
        return sorted((path, tuple(spec.shape.as_list()), spec.dtype.name) for path, spec in fields)

    if served is None or layout(served) != layout(signature):
        raise ValueError(
            OTHER_SIGNATURE.format(
                table=table_name,
                address=address,
                served=_describe(served),
                sequence_length=sequence_length,
                requested=_describe(signature),
            )
        )


# Reverb logs a line per 100 chunks read while it loads a checkpoint: hundreds of lines for a large table.
CHECKPOINT_PROGRESS = [r"Still reading compressed trajectory data\. \d+ records have been read so far"]


def start_server(tables: list[Any], port: int | None = None, checkpointer: Any = None) -> Any:
    """`reverb.Server(tables, port, checkpointer)`, its start-up log written on once it has started.

    Reverb's server starts, and loads the checkpointer's checkpoint, holding the GIL while it logs. In a
    Jupyter kernel (Colab's included) stderr is a pipe that a Python thread empties: a checkpoint whose
    loading logs more than the pipe holds (about 64 KiB: some 50,000 chunks) would stop the kernel for
    good. Its log goes to a file meanwhile and is written to stderr after, less the per-100-chunks
    progress lines.
    """
    reverb = import_reverb()
    with _noise.stderr_without(CHECKPOINT_PROGRESS):
        return reverb.Server(tables, port=port, checkpointer=checkpointer)


def make_table(
    data_spec: Any,
    sequence_length: int,
    table_name: str,
    capacity: int,
    sampler: str = "uniform",
    priority_exponent: float = 0.6,
    rate_limiter: Any = None,
) -> Any:
    """The Reverb table a `ReverbReplayBuffer` of these options reads and writes (FIFO removal).

    Items are windows of `sequence_length` frames of `data_spec` (the table's
    signature); `rate_limiter` defaults to `MinSize(1)`. A standalone server
    (`scripts/replay_server.py`) serves the same table to buffers given its address.
    """
    reverb = import_reverb()
    signature = table_signature(data_spec, sequence_length)
    return reverb.Table(
        name=table_name,
        sampler=reverb.selectors.Uniform() if sampler == "uniform" else reverb.selectors.Prioritized(priority_exponent),
        remover=reverb.selectors.Fifo(),
        max_size=capacity,
        rate_limiter=rate_limiter or reverb.rate_limiters.MinSize(1),
        signature=signature,
    )


def served_sampler(client: Any, table_name: str) -> str:
    """How a served table samples, "uniform" or "prioritized" (or its Reverb options when neither).

    `client` is a `reverb.Client` or a "host:port" address.
    """
    if isinstance(client, str):
        client = import_reverb().Client(client)
    options = client.server_info()[table_name].sampler_options
    if options.HasField("uniform"):
        return "uniform"
    if options.HasField("prioritized"):
        return "prioritized"
    return str(options).strip()


def table_signature(data_spec: Any, sequence_length: int) -> Any:
    """The signature of a table of windows of `sequence_length` frames of `data_spec`."""
    return tf.nest.map_structure(
        lambda spec: tf.TensorSpec([sequence_length, *spec.shape], spec.dtype, spec.name), specs.unwrap(data_spec)
    )


def _describe(nest: Any) -> str:
    """`{path: dtype[shape]}` of a nest of specs, for messages."""
    if nest is None:
        return "no signature"
    fields = sorted(specs.flatten_spec(nest))
    return "{" + ", ".join(f"{path}: {spec.dtype.name}{spec.shape.as_list()}" for path, spec in fields) + "}"


def make_rate_limiter(min_size: int, samples_per_insert: Any = None, error_buffer: Any = None) -> Any:
    """Reverb's `MinSize`, or `SampleToInsertRatio` when `samples_per_insert` is given (arguments checked).

    The rate limiter of `ReverbReplayBuffer(min_size_to_sample=, samples_per_insert=, error_buffer=)`,
    for `make_table` and servers started apart from a buffer.
    """
    reverb = import_reverb()
    ratio = check_ratio(min_size, samples_per_insert, error_buffer)
    if ratio is None:
        return reverb.rate_limiters.MinSize(min_size)
    return reverb.rate_limiters.SampleToInsertRatio(ratio[0], min_size, ratio[1])
