"""Variables sharded over the parameter servers: the partitioner, whole weights back, the shard table.

Under ``parameter_server`` a large variable can be split along its first axis into shards that
TensorFlow places round-robin on the ps tasks (a ``ShardedVariable``), so no ps task holds, sends
and updates the whole of it. ``runtime.variable_partitioner`` says how:

* ``none`` (the default): every variable whole, on one ps task.
* ``min_size`` (``--shard-variables MIN_SHARD_MB``): TensorFlow's ``MinSizePartitioner``, as many
  shards as there are ps tasks (``runtime.max_shards``), none smaller than
  ``runtime.min_shard_bytes``; small variables stay whole.
* ``max_size``: ``MaxSizePartitioner``, the fewest shards none larger than
  ``runtime.max_shard_bytes``. A variable that would need more shards than ``max_shards`` allows
  is refused rather than left with shards over the size asked for.

What tfopt adds around TensorFlow's partitioners:

* **Whole weights.** A tf_keras layer lists a sharded weight as its shards; :func:`full_weights`
  joins them, in the order an unsharded copy of the model (``clone_model`` outside the strategy)
  takes in ``set_weights``, and :func:`set_full_weights` splits whole arrays into a model's own
  shards. Every copy of weights between models goes through them, so a sharded run's
  ``model.keras`` and ``.tflite`` are those of the same weights unsharded.
* **Resharding.** A checkpoint stores a sharded variable as slices of one full tensor, so a backup
  written with one sharding restores into another, or into none; the partitioner settings are
  therefore left out of a run's fingerprint and a resumed run may change them.
* **Variables tfmot wraps stay whole.** tfmot's wrappers cannot hold a ``ShardedVariable``:
  pruning updates its masks with the strategy's ``extended.update``, which refuses one
  ("ShardedVariable doesn't support being used as a reference"), and QAT reads
  ``kernel.get_shape()``, which it lacks. The optimize phases therefore build the layers they
  wrap, and the wrappers' own variables, inside :func:`kept_whole`; the other layers are sharded.
* **The table** (:func:`shard_table`): each variable's shape, bytes and shards with their ps
  tasks, recorded in ``run.json``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading

from tfopt.core._keras import keras, tf

import numpy as np

from tfopt.config import RuntimeConfig
from tfopt.core import _compat
from tfopt.core.errors import ConfigError

_MIB = 1 << 20
_local = threading.local()


@contextlib.contextmanager
def kept_whole():
    """Variables created inside (this thread) are not sharded, whatever the partitioner says."""
    before = getattr(_local, "whole", False)
    _local.whole = True
    try:
        yield
    finally:
        _local.whole = before


def build_whole(layer: keras.layers.Layer) -> keras.layers.Layer:
    """Makes ``layer`` create its variables whole when it is built (see :func:`kept_whole`)."""
    build = layer.build

    @functools.wraps(build)
    def whole_build(*args, **kwargs):
        with kept_whole():
            return build(*args, **kwargs)

    layer.build = whole_build
    return layer


class _Switchable(tf.distribute.experimental.partitioners.Partitioner):
    """A partitioner that gives one shard inside :func:`kept_whole`."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, shape, dtype, axis=0):
        shape, dtype = tf.TensorShape(shape), tf.as_dtype(dtype)
        if getattr(_local, "whole", False):
            return [1] * len(shape)
        return self.inner(shape, dtype, axis)


def _mib(n: float) -> str:
    return f"{n / _MIB:.3g} MiB"


class _MaxSize(tf.distribute.experimental.partitioners.Partitioner):
    """``MaxSizePartitioner`` that refuses a variable needing more than ``max_shards`` shards."""

    def __init__(self, max_shard_bytes: int, max_shards: int):
        self.max_shard_bytes, self.max_shards = max_shard_bytes, max_shards
        self._inner = tf.distribute.experimental.partitioners.MaxSizePartitioner(
            max_shard_bytes, max_shards
        )

    def __call__(self, shape, dtype, axis=0):
        rows = int(shape[axis])
        row_bytes = shape.num_elements() / rows * dtype.size if rows else 0
        per_shard = max(1, math.floor(self.max_shard_bytes / row_bytes)) if row_bytes else rows
        needed = math.ceil(rows / per_shard) if rows else 1
        if needed > self.max_shards:
            total = shape.num_elements() * dtype.size
            raise ConfigError(
                f"runtime.max_shard_bytes={self.max_shard_bytes}: a variable of shape "
                f"{tuple(shape.as_list())} ({_mib(total)}) needs {needed} shards of at most "
                f"{_mib(self.max_shard_bytes)}, more than the {self.max_shards} that "
                f"runtime.max_shards allows; raise runtime.max_shard_bytes to at least "
                f"{_mib(math.ceil(rows / self.max_shards) * row_bytes)}, or add ps tasks"
            )
        return self._inner(shape, dtype, axis)


def partitioner(runtime: RuntimeConfig, num_ps: int):
    """The variable partitioner ``runtime`` asks for, for a cluster of ``num_ps`` ps tasks.

    Args:
        runtime: ``variable_partitioner``, ``min_shard_bytes``, ``max_shard_bytes``, ``max_shards``.
        num_ps: The ps tasks of the cluster.

    Returns:
        A ``tf.distribute.experimental.partitioners.Partitioner``, or None for ``none``.

    Raises:
        ConfigError: ``max_shards`` is larger than the ps task count (two shards on one task
            cost transfers and buy nothing).
    """
    if runtime.variable_partitioner == "none":
        return None
    shards = runtime.max_shards or num_ps
    if shards > num_ps:
        raise ConfigError(
            f"runtime.max_shards={runtime.max_shards} is more than the {num_ps} ps task(s) of the "
            f"cluster; give at most {num_ps} (0 = one shard per ps task), or start more ps tasks"
        )
    if runtime.variable_partitioner == "min_size":
        inner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=runtime.min_shard_bytes, max_shards=shards
        )
    else:
        inner = _MaxSize(runtime.max_shard_bytes, shards)
    return _Switchable(inner)


def _groups(weights: list) -> list[list]:
    """``weights`` grouped into whole variables: a sharded one's shards are consecutive."""
    out, last = [], None
    for w in weights:
        container = _compat.sharded_container(w)
        if container is not None and container is last:
            out[-1].append(w)
        else:
            out.append([w])
        last = container
    return out


def _whole_name(group: list) -> str:
    """``dense/kernel:0`` for a whole variable and for the shards ``dense/kernel/part_<i>:0``."""
    name = group[0].name
    return name.rsplit("/part_", 1)[0] + ":0" if len(group) > 1 else name


def _joined(weights: list, values: list) -> list[tuple[str, np.ndarray]]:
    """``(name, whole value)`` of each variable among ``weights``, given their ``values``."""
    values = iter(values)
    return [
        (
            _whole_name(group),
            np.concatenate([next(values) for _ in group], axis=0)
            if len(group) > 1
            else next(values),
        )
        for group in _groups(weights)
    ]


def whole_values(weights: list) -> list[tuple[str, np.ndarray]]:
    """``(name, value)`` of each whole variable among ``weights`` (a layer's, say)."""
    return _joined(list(weights), keras.backend.batch_get_value(list(weights)))


def whole_names(weights: list) -> list[str]:
    """The name of each whole variable among ``weights``, in :func:`full_weights`' order."""
    return [_whole_name(group) for group in _groups(weights)]


def named_full_weights(model: keras.Model) -> dict[str, np.ndarray]:
    """``{whole variable name: whole value}`` of ``model``, read as ``model.get_weights()`` reads
    them (in the model's strategy scope: a collective under MultiWorkerMirrored)."""
    return dict(_joined(model.weights, model.get_weights()))


def full_weights(model: keras.Model) -> list[np.ndarray]:
    """``model.get_weights()`` with each sharded variable's shards joined into the whole array.

    The list fits ``set_weights`` of the same model built without a partitioner; for a model
    without sharded variables it is ``model.get_weights()``.
    """
    return [value for _, value in _joined(model.weights, model.get_weights())]


def set_full_weights(model: keras.Model, values: list) -> None:
    """``model.set_weights`` from whole arrays (:func:`full_weights`' order), split to its shards.

    ``model`` may be sharded differently from the model the values came from, or not at all.
    """
    values = list(values)
    groups = _groups(model.weights)
    if len(values) != len(groups):
        raise ValueError(
            f"{model.name!r} has {len(groups)} variables and was given {len(values)} arrays"
        )
    flat = []
    for group, value in zip(groups, values):
        if len(group) == 1:
            flat.append(value)
        else:
            edges = np.cumsum([int(v.shape[0]) for v in group])[:-1]
            flat.extend(np.split(np.asarray(value), edges, axis=0))
    model.set_weights(flat)


def _task(device: str) -> str:
    spec = tf.DeviceSpec.from_string(device)
    return f"{spec.job}:{spec.task}" if spec.job else device


def shard_table(model: keras.Model) -> list[dict]:
    """Each of ``model``'s variables: name, shape, bytes and its shards with the ps task of each.

    A variable that is not sharded is listed with its one shard.
    """
    rows = []
    for group in _groups(model.weights):
        name, shape = _whole_name(group).split(":")[0], group[0].shape.as_list()
        if len(group) > 1:
            shape[0] = sum(int(v.shape[0]) for v in group)
        rows.append(
            {
                "name": name,
                "shape": shape,
                "bytes": int(np.prod(shape)) * group[0].dtype.size,
                "shards": [{"shape": v.shape.as_list(), "task": _task(v.device)} for v in group],
            }
        )
    return rows
