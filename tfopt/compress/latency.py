"""A NetAdapt-style latency table: each prunable layer timed alone in LiteRT at a grid of widths.

    grid = layer_grid(model, [counts_now, counts_half, counts_min])   # what to time
    times = time_signatures(model, entries(model, grid), threads=1)
    table = Table.measured(model, grid, times, now=counts_now, threads=1)
    table.predict(counts)      # the float .tflite's batch-1 p50 in microseconds, predicted

Every layer whose widths channel pruning changes (Conv2D, SeparableConv2D, DepthwiseConv2D,
Dense) is rebuilt alone at each pair of input and output widths of the grid, with its own
kernel size, strides, padding and fused activation, and becomes one signature of a
multi-signature .tflite (20 signatures each: the converter's time grows faster than their
number); layers alike but for their names are timed once. The whole model is converted on its
own. The LiteRT interpreter (its default XNNPACK
delegate on) times each signature's bare invoke; passes over all signatures are interleaved and
the median of the passes is kept. Between grid points the time is interpolated bilinearly. A
pruned model's predicted latency is the whole model's measured p50 minus its layers' times at
their widths now plus their times at the new widths.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfopt.core._keras import keras, tf

import numpy as np

from tfopt.core import native_stderr
from tfopt.core._compat import signature_invoker
from tfopt.core.timing import time_calls

L = keras.layers
MODEL_KEY = "model"
CHUNK = 20  # signatures per conversion


@dataclass(frozen=True)
class Entry:
    """One layer at one pair of widths: a signature of the table's .tflite."""

    layer: str
    cin: int
    cout: int


def layer_grid(
    model: keras.Model, counts: list[dict[str, tuple[int, int]]]
) -> dict[str, tuple[list, list]]:
    """Layer -> (input widths, output widths) to time: every width any of ``counts`` gives it.

    Args:
        model: The model about to be pruned.
        counts: Weighted layer -> (input channels kept, output channels kept), one dict per
            share of the channels removed (the dense model's, a middle one, the floor's).
    """
    grid = {}
    for name in counts[0]:
        cins = sorted({c[name][0] for c in counts})
        couts = sorted({c[name][1] for c in counts})
        if isinstance(model.get_layer(name), L.DepthwiseConv2D):
            couts = cins  # a depthwise convolution's output follows its input
        grid[name] = (cins, couts)
    return grid


def entries(model: keras.Model, grid: dict[str, tuple[list, list]]) -> list[Entry]:
    """The signatures to time, in a fixed order (every worker builds the same list)."""
    out = []
    for name, (cins, couts) in grid.items():
        depthwise = isinstance(model.get_layer(name), L.DepthwiseConv2D)
        out.extend(
            Entry(name, cin, cin if depthwise else cout)
            for cin in cins
            for cout in ([0] if depthwise else couts)
        )
    return out


def _alone(layer, cin: int, cout: int):
    """A fresh copy of ``layer`` with ``cin`` inputs and ``cout`` outputs, built, random weights."""
    config = dict(layer.get_config(), dtype="float32")
    config.pop("name", None)
    if isinstance(layer, L.Dense):
        config["units"] = cout
    elif not isinstance(layer, L.DepthwiseConv2D):
        config["filters"] = cout
    copy = type(layer).from_config(config)
    shape = (1, *[int(d) for d in layer.input_shape[1:-1]], cin)
    copy.build(shape)
    return copy, shape


def _signature(fn, name: str, spec):
    fn.__name__ = name  # the signature's key in the .tflite
    return tf.function(fn).get_concrete_function(spec)


def _convert(functions: list, keep) -> bytes:
    with native_stderr.quiet():  # the converter's notices on fd 2
        return tf.lite.TFLiteConverter.from_concrete_functions(functions, keep).convert()


def _contents(model: keras.Model, todo: list[Entry]):
    """``(.tflite, signature keys)``: the whole model's, then ``CHUNK`` entries' each (``t<i>``)."""
    spec = tf.TensorSpec((1, *[int(d) for d in model.input_shape[1:]]), tf.float32, name="x")
    yield (
        _convert([_signature(lambda x: {"y": model(x, training=False)}, MODEL_KEY, spec)], model),
        [MODEL_KEY],
    )
    for start in range(0, len(todo), CHUNK):
        functions, layers = [], []
        for i, entry in enumerate(todo[start : start + CHUNK], start):
            layer, shape = _alone(model.get_layer(entry.layer), entry.cin, entry.cout)
            layers.append(layer)
            functions.append(
                _signature(
                    lambda x, layer=layer: {"y": layer(x)},
                    f"t{i}",
                    tf.TensorSpec(shape, tf.float32, name="x"),
                )
            )
        keep = tf.Module()
        keep.layers = layers
        yield _convert(functions, keep), [f"t{i}" for i in range(start, start + len(layers))]


def _same(model: keras.Model, entry: Entry) -> tuple:
    """What decides an entry's time: the layer's type and settings, its input size and its widths."""
    layer = model.get_layer(entry.layer)
    config = {k: v for k, v in layer.get_config().items() if k != "name"}
    return (
        type(layer).__name__,
        repr(sorted(config.items())),
        tuple(layer.input_shape[1:-1]),
        entry.cin,
        entry.cout,
    )


def time_signatures(
    model: keras.Model, todo: list[Entry], *, threads: int = 1, passes: int = 3, runs: int = 20
) -> np.ndarray:
    """The p50 in microseconds of the whole model, then of each entry, in LiteRT.

    Entries that differ only in their layer's name are timed once.

    Args:
        model: The float model (strategy-free).
        todo: The entries, as :func:`entries` lists them.
        threads: Interpreter threads.
        passes: Interleaved passes over every signature; the median of the passes is kept.
        runs: Timed invokes per signature and pass (after 3 untimed).

    Returns:
        ``len(todo) + 1`` times: the model's first.
    """
    from ai_edge_litert.interpreter import Interpreter

    first: dict[tuple, int] = {}
    which = [first.setdefault(_same(model, e), len(first)) for e in todo]
    unique = [todo[which.index(k)] for k in range(len(first))]
    invokes = []
    rng = np.random.default_rng(0)
    for content, keys in _contents(model, unique):
        with (
            native_stderr.filtered()
        ):  # LiteRT announces its XNNPACK delegate on fd 2 at the first invoke
            interpreter = Interpreter(model_content=content, num_threads=threads)
            if len(keys) == 1:  # a lone signature is the converter's serving_default
                keys = list(interpreter.get_signature_list())
            for key in keys:
                runner = interpreter.get_signature_runner(key)
                runner(x=rng.random(runner.get_input_details()["x"]["shape"], dtype=np.float32))
                invokes.append(signature_invoker(runner))
    times = np.empty((passes, len(invokes)))
    for p in range(passes):
        for i, invoke in enumerate(invokes):
            times[p, i] = time_calls(invoke, warmup=3, runs=runs)["p50_ms"] * 1e3
    median = np.median(times, axis=0)
    return np.array([median[0]] + [median[1 + k] for k in which])


@dataclass
class Table:
    """Measured times and what they predict.

    Attributes:
        base_us: The whole (unpruned) model's p50.
        now: Layer -> its (input, output) widths in that model.
        grid: Layer -> (input widths, output widths, times[input][output] in microseconds).
        threads: Interpreter threads it was measured with.
    """

    base_us: float
    now: dict[str, tuple[int, int]]
    grid: dict[str, tuple[list, list, np.ndarray]]
    threads: int

    @classmethod
    def measured(
        cls,
        model: keras.Model,
        grid: dict[str, tuple[list, list]],
        times: np.ndarray,
        *,
        now: dict[str, tuple[int, int]],
        threads: int,
    ) -> Table:
        """The table of ``times`` (from :func:`time_signatures` over :func:`entries` of ``grid``)."""
        index = {entry: i + 1 for i, entry in enumerate(entries(model, grid))}
        depthwise = {n for n in grid if isinstance(model.get_layer(n), L.DepthwiseConv2D)}
        out = {}
        for name, (cins, couts) in grid.items():
            out[name] = (
                cins,
                couts,
                np.array(
                    [
                        [times[index[Entry(name, a, a if name in depthwise else b)]] for b in couts]
                        for a in cins
                    ]
                ),
            )
        return cls(float(times[0]), dict(now), out, threads)

    def layer_us(self, name: str, cin: int, cout: int) -> float:
        """The layer's time at these widths (bilinear between grid points, held at the edges)."""
        cins, couts, t = self.grid[name]
        row = [
            np.interp(cout, couts, t[i]) if len(couts) > 1 else t[i][0] for i in range(len(cins))
        ]
        return float(np.interp(cin, cins, row) if len(cins) > 1 else row[0])

    def predict(self, counts: dict[str, tuple[int, int]]) -> float:
        """The model's p50 in microseconds with its layers at ``counts``' widths."""
        return self.base_us + sum(
            self.layer_us(n, *counts[n]) - self.layer_us(n, *self.now[n]) for n in self.grid
        )

    def to_dict(self) -> dict:
        """JSON-ready: the base and each layer's grid (the run record's ``latency.table``)."""
        return {
            "base_us": round(self.base_us, 2),
            "threads": self.threads,
            "layers": {
                n: {"cin": c, "cout": o, "us": np.round(t, 2).tolist()}
                for n, (c, o, t) in self.grid.items()
            },
        }


def model_us(model: keras.Model, *, threads: int = 1, passes: int = 3, runs: int = 50) -> float:
    """The float .tflite of ``model``: its batch-1 p50 in microseconds in LiteRT."""
    return float(time_signatures(model, [], threads=threads, passes=passes, runs=runs)[0])
