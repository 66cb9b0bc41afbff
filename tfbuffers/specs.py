"""Data specs and the checks that guard every buffer's input.

Every buffer in tfbuffers describes one stored item with a nest of specs (`tf.TensorSpec`,
`tf_agents.specs.ArraySpec`, or anything with `shape` and `dtype`) and checks each `add_batch` against
it *before* it touches storage. The checks live here, once, so that every buffer rejects the same bad
input with the same message. A message always names the field's nest path, what was expected and what
was received::

    observation/pixels: expected dtype uint8, got float32

The message templates below are part of the public contract and are tested to the letter.
"""

from __future__ import annotations

import collections.abc
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

# Message templates. `path` is the field's nest path, `<root>` for a bare spec.
NOT_A_SPEC = "{path}: expected a TensorSpec or ArraySpec, got {received}"
UNDEFINED_SHAPE = "{path}: expected a fully defined shape, got {received}"
UNSUPPORTED_DTYPE = "{path}: expected a numeric or bool dtype, got {received}"
WRONG_KIND = "{path}: expected {expected}, got {received}"
MISSING_KEYS = "{path}: missing key(s) {missing}; expected keys {expected}"
UNEXPECTED_KEYS = "{path}: unexpected key(s) {unexpected}; expected keys {expected}"
WRONG_LENGTH = "{path}: expected {expected} elements, got {received}"
WRONG_FIELDS = "{path}: expected fields {expected}, got {received}"
WRONG_DTYPE = "{path}: expected dtype {expected}, got {received}"
WRONG_BATCH_SIZE = "{path}: expected leading batch size {expected}, got {received} (shape {shape})"
WRONG_SHAPE = "{path}: expected shape {expected}, got {received}"
# In a graph the received shape is known only when it runs: the assertion appends it.
WRONG_BATCH_SIZE_IN_GRAPH = "{path}: expected leading batch size {expected}, got shape"
WRONG_SHAPE_IN_GRAPH = "{path}: expected shape {expected}, got"
RAGGED_VALUE = "{path}: expected a rectangular array, got ragged nested lists"
LOSSY_VALUE = "{path}: expected values representable as {expected}, got {received}"

ROOT = "<root>"


class Field(NamedTuple):
    """One leaf of a data spec: its nest path and its normalised spec."""

    path: str
    spec: tf.TensorSpec


class DeferredShapeCheck(NamedTuple):
    """A shape that only a running graph can check (a dimension is `None` at trace time)."""

    path: str
    value: tf.Tensor
    expected: tuple[int, ...]
    outer_dims: int = 0
    """How many of `expected`'s leading dimensions are batch dimensions."""


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _join(path: str, key: Any) -> str:
    return str(key) if path == ROOT else f"{path}/{key}"


def _kind(value: Any) -> str:
    if _is_namedtuple(value):
        return f"namedtuple {type(value).__name__}"
    if tf.is_tensor(value):
        return "Tensor"
    return type(value).__name__


def _children(value: Any) -> list[tuple[Any, Any]] | None:
    """(key, child) pairs in `tf.nest.flatten` order, or None for a leaf."""
    if isinstance(value, collections.abc.Mapping):
        return [(key, value[key]) for key in sorted(value)]
    if _is_namedtuple(value):
        return list(zip(value._fields, value))
    if isinstance(value, (list, tuple)):
        return list(enumerate(value))
    return None


def unwrap(structure: Any) -> Any:
    """`structure` with plain Python containers in place of `tf.Module`'s tracking wrappers.

    A spec kept as a `tf.Module` attribute (an agent's `collect_data_spec`) comes
    back wrapped (`_DictWrapper`, `ListWrapper`, `_TupleWrapper` around a
    namedtuple); the buffer stores, packs and returns the plain nest instead. A
    nest with no wrapper is returned as it is.
    """
    children = _children(structure)
    if children is None:
        return structure
    values = [unwrap(child) for _, child in children]
    wrapped = type(structure).__module__ == _WRAPPERS
    if not wrapped and all(value is child for value, (_, child) in zip(values, children)):
        return structure
    if isinstance(structure, collections.abc.Mapping):
        by_key = dict(zip([key for key, _ in children], values))
        kind: Any = dict if wrapped else type(structure)
        return kind((key, by_key[key]) for key in structure)  # the caller's key order
    if _is_namedtuple(structure):
        return type(getattr(structure, "__wrapped__", structure))(*values)
    if isinstance(structure, tuple):
        return tuple(values)
    return list(values)


_WRAPPERS = "tensorflow.python.trackable.data_structures"


def _as_tensor_spec(path: str, spec: Any) -> tf.TensorSpec:
    if isinstance(spec, tf.TensorSpec):
        tensor_spec = spec
    elif hasattr(spec, "shape") and hasattr(spec, "dtype") and not tf.is_tensor(spec):
        if isinstance(spec, np.ndarray):
            raise TypeError(NOT_A_SPEC.format(path=path, received="ndarray"))
        tensor_spec = tf.TensorSpec(spec.shape, tf.as_dtype(spec.dtype), getattr(spec, "name", None))
    else:
        raise TypeError(NOT_A_SPEC.format(path=path, received=type(spec).__name__))
    if not tensor_spec.shape.is_fully_defined():
        raise ValueError(UNDEFINED_SHAPE.format(path=path, received=_shape_str(tensor_spec.shape)))
    dtype = tensor_spec.dtype
    if not (dtype.is_floating or dtype.is_integer or dtype.is_bool or dtype.is_complex):
        raise ValueError(UNSUPPORTED_DTYPE.format(path=path, received=dtype.name))
    return tensor_spec


def flatten_spec(data_spec: Any) -> list[Field]:
    """Validates a data spec nest and returns its leaves in `tf.nest.flatten` order.

    Args:
      data_spec: A nest (dicts, lists, tuples, namedtuples) of `tf.TensorSpec`,
        `tf_agents` `ArraySpec`, or any objects with `shape` and `dtype`.

    Returns:
      One `Field(path, tf.TensorSpec)` per leaf.

    Raises:
      TypeError: If a leaf is not a spec.
      ValueError: If a leaf's shape is not fully defined or its dtype is not
        numeric or bool.
    """
    fields: list[Field] = []

    def walk(spec: Any, path: str) -> None:
        children = _children(spec)
        if children is None:
            fields.append(Field(path, _as_tensor_spec(path, spec)))
            return
        for key, child in children:
            walk(child, _join(path, key))

    walk(data_spec, ROOT)
    if len(fields) != len(tf.nest.flatten(data_spec)):
        raise TypeError(f"data_spec: unsupported nest type in {data_spec!r}; use dicts, lists, tuples or namedtuples")
    return fields


def to_tensor_spec(data_spec: Any) -> Any:
    """Returns `data_spec` with every leaf converted to a `tf.TensorSpec`."""
    fields = iter(flatten_spec(data_spec))
    return tf.nest.map_structure(lambda _: next(fields).spec, data_spec)


def _shape_str(shape: Any) -> str:
    dims = tf.TensorShape(shape).as_list() if tf.TensorShape(shape).rank is not None else None
    if dims is None:
        return "<unknown rank>"
    return "(" + ", ".join("None" if d is None else str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def _check_structure(value: Any, spec: Any, path: str, leaves: list[Any]) -> None:
    spec_children = _children(spec)
    if spec_children is None:
        leaves.append(value)
        return
    if isinstance(spec, collections.abc.Mapping):
        if not isinstance(value, collections.abc.Mapping):
            raise TypeError(WRONG_KIND.format(path=path, expected="a mapping", received=_kind(value)))
        expected = sorted(spec)
        missing = [k for k in expected if k not in value]
        if missing:
            raise TypeError(MISSING_KEYS.format(path=path, missing=missing, expected=expected))
        unexpected = sorted(k for k in value if k not in spec)
        if unexpected:
            raise TypeError(UNEXPECTED_KEYS.format(path=path, unexpected=unexpected, expected=expected))
        for key in expected:
            _check_structure(value[key], spec[key], _join(path, key), leaves)
        return
    if _is_namedtuple(spec):
        if not _is_namedtuple(value):
            raise TypeError(WRONG_KIND.format(path=path, expected=_kind(spec), received=_kind(value)))
        if tuple(value._fields) != tuple(spec._fields):
            raise TypeError(WRONG_FIELDS.format(path=path, expected=list(spec._fields), received=list(value._fields)))
    elif not isinstance(value, (list, tuple)) or _is_namedtuple(value):
        raise TypeError(WRONG_KIND.format(path=path, expected="a list or tuple", received=_kind(value)))
    if len(value) != len(spec):
        raise TypeError(WRONG_LENGTH.format(path=path, expected=len(spec), received=len(value)))
    for (key, child_spec), child in zip(spec_children, value):
        _check_structure(child, child_spec, _join(path, key), leaves)


def flatten_like(items: Any, data_spec: Any) -> list[Any]:
    """The leaves of `items` at the positions of `data_spec`'s leaves, in `tf.nest.flatten` order.

    Unlike `tf.nest.flatten`, a Python list where the spec has a leaf stays one
    leaf (a value to convert), so Python values can be given for array fields.

    Raises:
      TypeError: If the structure differs from the spec's (see `check_batch`).
    """
    leaves: list[Any] = []
    _check_structure(items, data_spec, ROOT, leaves)
    return leaves


# (from, to) numpy dtype kinds a Python value may be converted between.
_CONVERTIBLE_KINDS = frozenset(
    [("b", "b"), ("f", "f"), ("f", "c"), ("c", "c")] + [(a, b) for a in "iu" for b in "iufc"]
)


def _python_to_array(path: str, value: Any, dtype: tf.DType) -> np.ndarray:
    """Converts Python scalars and (nested) lists to `dtype`, refusing what would change a value.

    Python values carry no precision, so floats round to the nearest value of a
    float dtype (as `tf.constant` does), but may not overflow; integers and
    bools must survive exactly.
    """
    try:
        inferred = np.asarray(value)
    except ValueError:  # numpy refuses ragged nested lists
        raise ValueError(RAGGED_VALUE.format(path=path)) from None
    if inferred.dtype == object or inferred.dtype.kind in "USV":
        raise TypeError(WRONG_KIND.format(path=path, expected="an array, tensor or number", received=_kind(value)))
    target = np.dtype(dtype.as_numpy_dtype)
    if inferred.dtype == target:
        return inferred
    with np.errstate(all="ignore"):
        converted = inferred.astype(target)
        if (inferred.dtype.kind, target.kind) not in _CONVERTIBLE_KINDS:
            kept = False
        elif inferred.dtype.kind in "fc":
            kept = bool(np.all(np.isfinite(converted) == np.isfinite(inferred)))
        else:
            kept = bool(np.all(converted.astype(inferred.dtype) == inferred))
    if not kept:
        raise ValueError(
            LOSSY_VALUE.format(path=path, expected=dtype.name, received=f"{inferred.dtype.name} {value!r}")
        )
    return converted


def check_batch(
    items: Any, data_spec: Any, fields: Sequence[Field], outer_dims: tuple[int, ...]
) -> tuple[list[Any], list[DeferredShapeCheck]]:
    """Checks a batch of items against a data spec, before anything is stored.

    Tensors and numpy arrays must carry exactly the spec's dtype (nothing is cast); Python numbers and lists
    are converted to it when no value changes beyond float rounding (see `_python_to_array`).

    Args:
      items: The nest given to `add_batch`.
      data_spec: The buffer's data spec nest (for the structure).
      fields: `flatten_spec(data_spec)`.
      outer_dims: The leading dimensions every leaf must have, e.g. `(batch_size,)`.

    Returns:
      The leaves in `tf.nest.flatten` order (tensors stay tensors, everything else becomes a numpy array),
      and the shape checks that must run in the graph because a dimension is unknown at trace time.

    Raises:
      TypeError: If the structure differs (a missing or unexpected key, another container kind, another
        length) or a leaf is not array-like.
      ValueError: If a leaf's dtype, leading batch size or inner shape differs.
    """
    raw_leaves = flatten_like(items, data_spec)
    leaves: list[Any] = []
    deferred: list[DeferredShapeCheck] = []
    for (path, spec), value in zip(fields, raw_leaves):
        # numpy first: `tf.is_tensor` is a slow protocol check, and numpy is the py buffers' common case.
        if isinstance(value, np.ndarray | np.generic):
            value = np.asarray(value)
            if value.dtype.kind not in "biufc":
                raise TypeError(
                    WRONG_KIND.format(path=path, expected="a numeric array", received=f"{value.dtype} array")
                )
            dtype = value.dtype
            dims: list[int | None] | None = list(value.shape)
        elif tf.is_tensor(value):
            if isinstance(value, tf.SparseTensor | tf.RaggedTensor):
                raise TypeError(WRONG_KIND.format(path=path, expected="a dense tensor", received=_kind(value)))
            dtype = value.dtype
            dims = value.shape.as_list() if value.shape.rank is not None else None
        elif value is None or isinstance(value, str | bytes):
            raise TypeError(WRONG_KIND.format(path=path, expected="an array, tensor or number", received=_kind(value)))
        else:
            value = _python_to_array(path, value, spec.dtype)
            dtype = value.dtype
            dims = list(value.shape)
        if dtype != spec.dtype:
            raise ValueError(WRONG_DTYPE.format(path=path, expected=spec.dtype.name, received=tf.as_dtype(dtype).name))
        expected = (*outer_dims, *spec.shape.as_list())
        if dims is None:
            deferred.append(DeferredShapeCheck(path, value, expected, len(outer_dims)))
            leaves.append(value)
            continue
        if len(dims) != len(expected) or any(
            d is not None and d != e for d, e in zip(dims[len(outer_dims) :], expected[len(outer_dims) :])
        ):
            raise ValueError(WRONG_SHAPE.format(path=path, expected=_shape_str(expected), received=_shape_str(dims)))
        for d, e in zip(dims[: len(outer_dims)], outer_dims):
            if d is not None and d != e:
                raise ValueError(WRONG_BATCH_SIZE.format(path=path, expected=e, received=d, shape=_shape_str(dims)))
        if None in dims:
            deferred.append(DeferredShapeCheck(path, value, expected, len(outer_dims)))
        leaves.append(value)
    return leaves, deferred


class NumpyFastPath:
    """Accepts in a few microseconds the common batch that `check_batch` would pass unchanged.

    That is: exactly the spec's structure and container types, and every leaf a
    numpy array of exactly the expected dtype and shape. Anything else (Python
    values, tensors, any mismatch) goes to `check_batch`, which converts or
    explains; so both paths accept and reject the same batches.

    The check is compiled once from the spec into nested closures (one per
    container and leaf): about 3x faster than `tf.nest.assert_same_structure`
    followed by `tf.nest.flatten`, which matters for a py buffer's add.
    """

    def __init__(self, data_spec: Any, fields: Sequence[Field], outer_dims: tuple[int, ...]) -> None:
        """Precomputes the expected dtype and shape of every leaf."""
        expected = iter(
            [
                (np.dtype(field.spec.dtype.as_numpy_dtype), (*outer_dims, *field.spec.shape.as_list()))
                for field in fields
            ]
        )
        self._match = _compile_matcher(data_spec, expected)

    def leaves(self, items: Any) -> list[np.ndarray] | None:
        """The leaves of `items`, in `tf.nest.flatten` order, if it is such a batch, else None."""
        leaves: list[np.ndarray] = []
        return leaves if self._match(items, leaves) else None


_Matcher = Callable[[Any, list], bool]


def _compile_matcher(spec: Any, expected: Any) -> _Matcher:
    """A function that appends the leaves of a value shaped exactly like `spec` and returns True, else False."""
    children = _children(spec)
    if children is None:
        dtype, shape = next(expected)

        def match_leaf(value: Any, out: list) -> bool:
            if type(value) is np.ndarray and value.dtype == dtype and value.shape == shape:
                out.append(value)
                return True
            return False

        return match_leaf
    container = type(spec)
    keys = [key for key, _ in children]
    matchers = [_compile_matcher(child, expected) for _, child in children]
    size = len(children)
    if isinstance(spec, collections.abc.Mapping):

        def match_mapping(value: Any, out: list) -> bool:
            if type(value) is not container or len(value) != size:
                return False
            try:
                return all(match(value[key], out) for key, match in zip(keys, matchers))
            except KeyError:
                return False

        return match_mapping

    def match_sequence(value: Any, out: list) -> bool:
        if type(value) is not container or len(value) != size:
            return False
        return all(match(child, out) for child, match in zip(value, matchers))

    return match_sequence


def graph_shape_assertions(deferred: Sequence[DeferredShapeCheck]) -> list[Any]:
    """Builds the in-graph checks of shapes unknown at trace time.

    Each raises `tf.errors.InvalidArgumentError` when run with a wrong shape, with
    the eager check's message up to the received shape, which the graph appends:
    `x: expected leading batch size 2, got shape [3 2]` for a batch dimension,
    `x: expected shape (2, 2), got [2 3]` for the others.
    """
    checks = []
    for check in deferred:
        shape = tf.shape(check.value, out_type=tf.int64)
        rank = len(check.expected)
        # The shape padded (or cut) to the expected rank: -1 where a dimension is missing.
        head = tf.concat([shape, tf.fill([rank], tf.constant(-1, tf.int64))], 0)[:rank]
        expected = tf.constant(check.expected, tf.int64)
        batch_ok = tf.reduce_all(tf.equal(head[: check.outer_dims], expected[: check.outer_dims]))
        batch = WRONG_BATCH_SIZE_IN_GRAPH.format(
            path=check.path, expected=", ".join(map(str, check.expected[: check.outer_dims]))
        )
        batch_checked = tf.debugging.Assert(batch_ok, [batch, shape], summarize=rank + 1)
        with tf.control_dependencies([batch_checked]):
            shape_ok = tf.logical_and(tf.equal(tf.size(shape), rank), tf.reduce_all(tf.equal(head, expected)))
            message = WRONG_SHAPE_IN_GRAPH.format(path=check.path, expected=_shape_str(check.expected))
            checks.append(tf.debugging.Assert(shape_ok, [message, shape], summarize=rank + 1))
    return checks


def pack(data_spec: Any, leaves: Sequence[Any]) -> Any:
    """Packs flat leaves back into the structure of `data_spec`."""
    return tf.nest.pack_sequence_as(data_spec, list(leaves))


def packer(data_spec: Any) -> Callable[[Sequence[Any]], Any]:
    """`pack` for one structure, planned once: a function of the flat leaves.

    `tf.nest.pack_sequence_as` inspects the structure on every call (some 30 µs for a Trajectory, as much
    as a whole small sample). For structures made of dicts, lists, tuples and namedtuples the plan builds
    the containers directly, in `tf.nest`'s order (a dict's leaves by sorted key, its keys kept in their
    own order); any other container (attrs classes, other mappings, composite specs) packs through `tf.nest`.
    """

    def plan(spec: Any, start: int) -> tuple[Callable[[Sequence[Any]], Any], int] | None:
        if not tf.nest.is_nested(spec):
            return (lambda leaves: leaves[start]), start + 1
        kind = type(spec)
        if kind is dict:
            keys = sorted(spec)
        elif kind in (tuple, list) or (issubclass(kind, tuple) and hasattr(kind, "_fields")):
            keys = list(range(len(spec)))
        else:
            return None
        parts = []
        for key in keys:
            part = plan(spec[key], start)
            if part is None:
                return None
            parts.append(part[0])
            start = part[1]
        if kind is dict:
            order = [keys.index(key) for key in spec]
            names = list(spec)
            return (lambda leaves: {name: parts[i](leaves) for name, i in zip(names, order)}), start
        if kind in (tuple, list):
            return (lambda leaves: kind(part(leaves) for part in parts)), start
        return (lambda leaves: kind(*(part(leaves) for part in parts))), start

    planned = plan(data_spec, 0)
    if planned is None:
        return lambda leaves: pack(data_spec, leaves)
    build, count = planned

    def packed(leaves: Sequence[Any]) -> Any:
        if len(leaves) != count:
            return pack(data_spec, leaves)  # tf.nest's own error
        return build(leaves)

    return packed


def map_fields(fn: Callable[[Field], Any], data_spec: Any, fields: Sequence[Field]) -> Any:
    """Builds a nest shaped like `data_spec` with `fn(field)` at each leaf."""
    return pack(data_spec, [fn(field) for field in fields])


# A data spec as JSON, for buffer files: readable in the file's header, rebuilt without pickle.

_NAMEDTUPLE_MODULES = ("tf_agents.",)
"""Namedtuple types rebuilt as their own class (imported) when their module starts so: TF-Agents' `Trajectory`,
`TimeStep`, `PolicyStep`. Any other namedtuple comes back as a namedtuple of the same name and fields."""


def spec_to_json(data_spec: Any) -> Any:
    """`data_spec` as JSON-serialisable values: containers by kind, leaves by shape, dtype, name and bounds.

    `spec_from_json` rebuilds it: dicts, lists, tuples and namedtuples with the same keys, in the same
    order; leaves as `tf.TensorSpec`, or `BoundedTensorSpec` where the leaf has `minimum` and `maximum`.
    """

    def encode(spec: Any, path: str) -> Any:
        if isinstance(spec, collections.abc.Mapping):
            return {"dict": [[key, encode(value, _join(path, key))] for key, value in spec.items()]}
        if _is_namedtuple(spec):
            kind = type(getattr(spec, "__wrapped__", spec))
            fields = [[key, encode(value, _join(path, key))] for key, value in zip(spec._fields, spec)]
            return {"namedtuple": {"type": f"{kind.__module__}:{kind.__qualname__}", "fields": fields}}
        if isinstance(spec, (list, tuple)):
            container = "list" if isinstance(spec, list) else "tuple"
            return {container: [encode(value, _join(path, i)) for i, value in enumerate(spec)]}
        tensor_spec = _as_tensor_spec(path, spec)
        leaf: dict[str, Any] = {"shape": tensor_spec.shape.as_list(), "dtype": tensor_spec.dtype.name}
        if tensor_spec.name:
            leaf["name"] = tensor_spec.name
        if hasattr(spec, "minimum") and hasattr(spec, "maximum"):
            leaf["minimum"] = np.asarray(spec.minimum).tolist()
            leaf["maximum"] = np.asarray(spec.maximum).tolist()
        return {"spec": leaf}

    return encode(unwrap(data_spec), ROOT)


def spec_from_json(encoded: Any) -> Any:
    """The data spec `spec_to_json` encoded.

    Raises:
      ValueError: If `encoded` is not an encoding `spec_to_json` makes.
    """
    from tensorflow.python.framework import tensor_spec as tf_tensor_spec  # BoundedTensorSpec, as TF-Agents uses

    def decode(node: Any) -> Any:
        if not isinstance(node, dict) or len(node) != 1:
            raise ValueError(f"spec: expected a one-key object, got {node!r:.80}")
        ((kind, value),) = node.items()
        if kind == "dict":
            return {key: decode(child) for key, child in value}
        if kind in ("list", "tuple"):
            children = [decode(child) for child in value]
            return children if kind == "list" else tuple(children)
        if kind == "namedtuple":
            names = [key for key, _ in value["fields"]]
            return _namedtuple_type(value["type"], names)(*(decode(child) for _, child in value["fields"]))
        if kind == "spec":
            shape, dtype, name = value["shape"], tf.as_dtype(value["dtype"]), value.get("name")
            if "minimum" in value:
                return tf_tensor_spec.BoundedTensorSpec(shape, dtype, value["minimum"], value["maximum"], name)
            return tf.TensorSpec(shape, dtype, name)
        raise ValueError(f"spec: unknown kind {kind!r}")

    try:
        return decode(encoded)
    except (KeyError, TypeError) as error:
        raise ValueError(f"spec: malformed encoding ({type(error).__name__}: {error})") from None


def _namedtuple_type(qualified: str, fields: list[str]) -> Any:
    module, _, name = qualified.partition(":")
    if module.startswith(_NAMEDTUPLE_MODULES):
        import importlib

        try:
            kind: Any = importlib.import_module(module)
            for part in name.split("."):
                kind = getattr(kind, part)
        except (ImportError, AttributeError):
            kind = None
        if kind is not None and list(getattr(kind, "_fields", ())) == fields:
            return kind
    return collections.namedtuple(name.rsplit(".", 1)[-1], fields)


CONFIG_KEYS = "config: {key}: expected {expected}, got {received}"


def spec_from_config(config: collections.abc.Mapping[str, Any]) -> dict[str, tf.TensorSpec]:
    """A dict data spec from a config's parallel lists `names`, `shapes` and `dtypes` (MindSpore's form).

    Raises:
      TypeError, ValueError: Naming the key, what was expected and what was received.
    """

    def refused(key: str, expected: str, received: Any) -> ValueError:
        return ValueError(CONFIG_KEYS.format(key=key, expected=expected, received=received))

    lists = {}
    for key in ("names", "shapes", "dtypes"):
        value = config.get(key)
        if not isinstance(value, (list, tuple)) or not value:
            raise TypeError(CONFIG_KEYS.format(key=key, expected="a non-empty list", received=repr(value)))
        lists[key] = list(value)
    names, shapes, dtypes = lists["names"], lists["shapes"], lists["dtypes"]
    if not len(names) == len(shapes) == len(dtypes):
        received = f"{len(names)} names, {len(shapes)} shapes, {len(dtypes)} dtypes"
        raise refused("names/shapes/dtypes", "lists of one length", received)
    if len(set(names)) != len(names) or not all(isinstance(n, str) and n and "/" not in n for n in names):
        raise refused("names", "distinct non-empty strings without '/'", names)
    spec = {}
    for name, shape, dtype in zip(names, shapes, dtypes):
        if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise refused(f"shapes ({name})", "a list of ints >= 0", repr(shape))
        try:
            tf_dtype = tf.as_dtype(dtype)
        except TypeError:
            raise refused(f"dtypes ({name})", "a dtype name", repr(dtype)) from None
        spec[name] = tf.TensorSpec(list(shape), tf_dtype, name)
    flatten_spec(spec)  # the dtype checks every buffer makes
    return spec
