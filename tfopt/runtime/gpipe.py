"""GPipe pipeline parallelism: a model's layers in K stages on K devices, each batch in M micro-batches.

Huang et al. (2019): the layers are split into K contiguous stages, each placed on its own device
(its variables and its ops), and every batch into M micro-batches. In one ``tf.function`` each
stage runs the forward pass of every micro-batch as soon as the previous stage hands it over, so
stage k works on micro-batch m while stage k+1 works on micro-batch m-1; the loss is taken over
the whole batch's predictions, so the backward passes follow all the forward ones and the
gradients each stage's variables receive from the M micro-batches are summed before one optimizer
step. The step therefore computes what the unsplit model's step computes, up to the order of
float additions. A stage may recompute its activations in the backward pass instead of keeping
them (``remat``, ``tf.recompute_grad``): only the activations crossing stage boundaries are kept.
BatchNormalization normalizes each micro-batch by its own statistics and updates its moving
averages once per micro-batch, as GPipe does.

    part = partition(model, stages=2, by="params")
    pipelined = Pipelined(build_stages(model, part, stage_devices(2)), microbatches=8)
    pipelined.compile(optimizer, loss, metrics)   # then fit / evaluate as any Keras model
    copy_weights_back(pipelined, model)           # the trained weights in the user's model

A stage boundary carries exactly one tensor: a functional model can be cut only where its main
path is the one tensor alive (not inside a residual block). Sequential and functional tf_keras
models with one input and one output are split; a subclassed model has no layer graph to split.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tfopt.core._keras import keras, tf

from tfopt.core.errors import ConfigError

#: How ``partition`` weighs the layers when it balances the stages.
BALANCE = ("params", "flops")


@dataclass(frozen=True)
class Partition:
    """Where a model is cut.

    Attributes:
        stages: The layer names of each stage, in the model's order.
        outputs: The layer whose output leaves each stage (the last: the model's output).
        costs: Each stage's summed cost, in the unit of ``by``.
        by: ``params``, ``flops`` or ``names`` (cut where the user said).
    """

    stages: tuple[tuple[str, ...], ...]
    outputs: tuple[str, ...]
    costs: tuple[float, ...]
    by: str


class _Graph:
    """A functional model's config in topological order, with the places it can be cut."""

    def __init__(self, model: keras.Model):
        if isinstance(model, keras.Sequential):
            if not model.built or not model.inputs:
                raise ConfigError(
                    f"Sequential model {model.name!r} has no input shape; start it with "
                    "keras.Input(shape=...) so it can be split into pipeline stages"
                )
            model = keras.Model(model.inputs, model.outputs, name=model.name)
        if not getattr(model, "_is_graph_network", False):
            raise ConfigError(
                f"model {model.name!r} is a subclassed keras.Model, whose layer graph is Python "
                "code; --strategy pipeline splits functional and Sequential models"
            )
        if len(model.inputs) != 1 or len(model.outputs) != 1:
            raise ConfigError(
                f"model {model.name!r} has {len(model.inputs)} inputs and {len(model.outputs)} "
                "outputs; --strategy pipeline splits models with one of each"
            )
        self.model = model
        self.config = model.get_config()
        entries = {e["name"]: e for e in self.config["layers"]}
        self.input = self.config["input_layers"][0][0]
        self.output = self.config["output_layers"][0][0]
        self.inbound: dict[str, set[str]] = {}
        for name, entry in entries.items():
            if len(entry["inbound_nodes"]) > 1:
                raise ConfigError(
                    f"layer {name!r} of model {model.name!r} is called "
                    f"{len(entry['inbound_nodes'])} times (a shared layer); a pipeline stage "
                    "holds a layer's variables on one device, so shared layers cannot be split"
                )
            self.inbound[name] = {ref[0] for ref in _refs(entry["inbound_nodes"], entries)}
        self.entries = entries
        self.order = _topological(entries, self.inbound)  # without the input layer

    def crossing(self, i: int) -> list[str]:
        """The layers whose outputs a cut after ``order[i]`` would carry to the later stages."""
        before = {self.input, *self.order[: i + 1]}
        later = self.order[i + 1 :]
        alive = {p for name in later for p in self.inbound[name] if p in before}
        if self.output in before:
            alive.add(self.output)
        return sorted(alive, key=lambda n: -1 if n == self.input else self.order.index(n))

    def cuts(self) -> list[int]:
        """The indices ``i`` after which the model can be cut (one tensor crosses)."""
        return [i for i in range(len(self.order) - 1) if len(self.crossing(i)) == 1]


def _refs(node_data, entries) -> list[list]:
    """The ``[layer, node, tensor, ...]`` references to other layers in an inbound-node config."""
    found = []

    def walk(value):
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list | tuple):
            if (
                len(value) >= 3
                and isinstance(value[0], str)
                and value[0] in entries
                and isinstance(value[1], int)
                and isinstance(value[2], int)
            ):
                found.append(value)
            else:
                for v in value:
                    walk(v)

    walk(node_data)
    return found


def _topological(entries: dict, inbound: dict[str, set[str]]) -> list[str]:
    order, done = [], set()
    pending = [n for n, e in entries.items() if e["class_name"] != "InputLayer"]
    done.update(n for n, e in entries.items() if e["class_name"] == "InputLayer")
    while pending:
        ready = [n for n in pending if inbound[n] <= done]
        if not ready:
            raise ConfigError(f"layers {pending[:3]} form a cycle; the model cannot be split")
        for n in ready:
            order.append(n)
            done.add(n)
        pending = [n for n in pending if n not in done]
    return order


def _params(layer: keras.layers.Layer, model: keras.Model) -> float:
    return float(layer.count_params())


def partition(
    model: keras.Model,
    stages: int,
    *,
    by: str = "params",
    cut_after: Sequence[str] = (),
    macs: Callable | None = None,
) -> Partition:
    """Splits ``model``'s layers into ``stages`` contiguous stages.

    Args:
        model: A functional or Sequential tf_keras model with one input and one output.
        stages: K, the number of stages (>= 1).
        by: ``params`` or ``flops``: the stages' largest summed cost is made as small as the
            model's cut points allow. Ignored when ``cut_after`` is given.
        cut_after: The layers after which to cut (K-1 names), instead of balancing.
        macs: ``macs(layer, model)``, a layer's multiply-adds per example, for ``by="flops"``
            (:func:`tfopt.compress.flops.layer_macs`).

    Returns:
        The partition.

    Raises:
        ConfigError: a model that cannot be split (subclassed, several inputs or outputs, a
            shared layer), fewer cut points than K-1, or a name in ``cut_after`` that is not a
            layer or where a branch crosses the boundary (the message names the layers).
    """
    if stages < 1:
        raise ConfigError(f"--stages {stages} must be >= 1")
    graph = _Graph(model)
    order, cuts = graph.order, graph.cuts()
    if cut_after:
        chosen = _named_cuts(graph, list(cut_after), stages)
        by = "names"
        costs = [1.0] * len(order)
    else:
        if by not in BALANCE:
            raise ConfigError(f"--balance {by!r} is not valid; choose one of {', '.join(BALANCE)}")
        if len(cuts) < stages - 1:
            raise ConfigError(
                f"model {model.name!r} can be cut in {len(cuts)} places (one tensor crossing), "
                f"so it has at most {len(cuts) + 1} stages; --stages {stages} asks for more"
            )
        cost = _params if by == "params" else macs
        if cost is None:
            raise TypeError("partition(by='flops') needs macs=, a multiply-add counter")
        layers = {layer.name: layer for layer in graph.model.layers}
        costs = [float(cost(layers[n], graph.model)) for n in order]
        chosen = _balanced(costs, cuts, stages)
    bounds = [-1, *chosen, len(order) - 1]
    names = tuple(tuple(order[a + 1 : b + 1]) for a, b in zip(bounds, bounds[1:], strict=False))
    outputs = tuple(graph.crossing(i)[0] for i in bounds[1:])
    if by == "names":
        totals = tuple(float(len(s)) for s in names)
    else:
        totals = tuple(
            float(sum(costs[a + 1 : b + 1])) for a, b in zip(bounds, bounds[1:], strict=False)
        )
    return Partition(names, outputs, totals, by)


def _named_cuts(graph: _Graph, names: list[str], stages: int) -> list[int]:
    if len(names) != stages - 1:
        raise ConfigError(
            f"--cut-after names {len(names)} layers; --stages {stages} needs {stages - 1}"
        )
    chosen = []
    for name in names:
        if name not in graph.order:
            raise ConfigError(
                f"--cut-after {name!r} is not a layer of model {graph.model.name!r}; its layers: "
                f"{', '.join(graph.order[:8])}{', ...' if len(graph.order) > 8 else ''}"
            )
        i = graph.order.index(name)
        alive = graph.crossing(i)
        if i == len(graph.order) - 1 or len(alive) != 1:
            raise ConfigError(
                f"--cut-after {name!r}: the outputs of layers {', '.join(alive)} cross that "
                "boundary (a branch of the model); cut where one tensor crosses, e.g. after "
                f"{', '.join(graph.order[j] for j in graph.cuts()[:5])}"
            )
        chosen.append(i)
    if chosen != sorted(set(chosen)):
        raise ConfigError(f"--cut-after {', '.join(names)}: name the layers once each, in order")
    return chosen


def _balanced(costs: list[float], cuts: list[int], stages: int) -> list[int]:
    """The K-1 cut indices (from ``cuts``) that make the costliest stage as cheap as possible."""
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    n = len(costs)

    def span(a: int, b: int) -> float:  # the cost of layers a+1..b
        return prefix[b + 1] - prefix[a + 1]

    # best[j][c]: (max cost, cuts) of j stages ending with a cut after index c
    ends = [-1, *cuts]
    best = {(0, -1): (0.0, [])}
    for j in range(1, stages):
        for c in cuts:
            options = [
                (max(best[(j - 1, p)][0], span(p, c)), [*best[(j - 1, p)][1], c])
                for p in ends
                if p < c and (j - 1, p) in best
            ]
            if options:
                best[(j, c)] = min(options, key=lambda o: o[0])
    final = [
        (max(best[(stages - 1, p)][0], span(p, n - 1)), best[(stages - 1, p)][1])
        for p in ends
        if (stages - 1, p) in best and p < n - 1
    ]
    return min(final, key=lambda o: o[0])[1]


def stage_devices(stages: int) -> list[str]:
    """One device per stage: the GPUs when there are enough, else the logical CPU devices.

    Raises:
        ConfigError: fewer devices than stages (the message says how to make CPU devices).
    """
    for kind in ("GPU", "CPU"):
        devices = [d.name for d in tf.config.list_logical_devices(kind)]
        if len(devices) >= stages:
            return devices[:stages]
    cpus = len(tf.config.list_logical_devices("CPU"))
    raise ConfigError(
        f"--stages {stages} needs {stages} devices and this process has {cpus} CPU device(s) and "
        f"no {stages} GPUs; split the CPU with --cpu-replicas {stages}"
    )


def build_stages(model: keras.Model, part: Partition, devices: Sequence[str]) -> list[keras.Model]:
    """One functional model per stage, its variables created on its device, with ``model``'s weights.

    Stage k takes the output of stage k-1's last layer through an input layer of that layer's
    name, so every layer keeps its name (and the weights are matched by name).
    """
    if len(devices) != len(part.stages):
        raise ConfigError(f"{len(part.stages)} stages need as many devices, got {list(devices)}")
    graph = _Graph(model)
    layers = {layer.name: layer for layer in graph.model.layers}
    custom = {type(layer).__name__: type(layer) for layer in graph.model.layers}
    built, source = [], graph.input
    for names, output, device in zip(part.stages, part.outputs, devices, strict=True):
        config = {
            "name": f"{graph.model.name}_stage{len(built)}",
            "layers": [_input_entry(graph, source, layers)]
            + [copy.deepcopy(graph.entries[n]) for n in names],
            "input_layers": [[source, 0, 0]],
            "output_layers": [[output, 0, 0]],
        }
        with tf.device(device), keras.utils.custom_object_scope(custom):
            stage = keras.Model.from_config(config)
        for name in names:
            stage.get_layer(name).set_weights(layers[name].get_weights())
        built.append(stage)
        source = output
    return built


def _input_entry(graph: _Graph, name: str, layers: dict) -> dict:
    entry = copy.deepcopy(graph.entries[graph.input])
    if name == graph.input:
        return entry
    tensor = layers[name].output
    entry["name"] = entry["config"]["name"] = name
    entry["config"]["batch_input_shape"] = tuple(tensor.shape)
    entry["config"]["dtype"] = tensor.dtype.name
    return entry


def microbatch_sizes(batch, microbatches: int):
    """The sizes of ``microbatches`` near-equal parts of a batch of ``batch`` examples."""
    base, extra = batch // microbatches, batch % microbatches
    return base + tf.cast(tf.range(microbatches) < extra, batch.dtype)


class Pipelined(keras.Model):
    """The stages as one Keras model whose training step runs the GPipe schedule.

    ``fit``, ``evaluate`` and ``predict`` work as for any model; a training step splits the batch
    into ``microbatches`` parts, passes each through the stages on their devices, takes the
    loss over the whole batch and applies the summed gradients once.

    Args:
        stages: The stage models (:func:`build_stages`), in order.
        devices: Each stage's device.
        microbatches: M, the micro-batches per batch (>= 1).
        remat: Recompute each stage's activations in the backward pass instead of keeping them.
    """

    def __init__(
        self,
        stages: Sequence[keras.Model],
        devices: Sequence[str],
        microbatches: int,
        remat: bool = False,
        partition: Partition | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if microbatches < 1:
            raise ConfigError(f"--microbatches {microbatches} must be >= 1")
        self.stages = list(stages)
        self.devices = list(devices)
        self.microbatches = microbatches
        self.remat = remat
        self.partition = partition

    def describe(self) -> dict:
        """The split as ``run.json`` records it: each stage's layers, cost and device, M, the
        rematerialization, and GPipe's idle fraction (K-1)/(M+K-1) for this K and M."""
        k, m = len(self.stages), self.microbatches
        part = self.partition
        return {
            "stages": [
                {
                    "layers": len(names),
                    "first": names[0],
                    "last": names[-1],
                    "cost": cost,
                    "device": device,
                }
                for names, cost, device in zip(part.stages, part.costs, self.devices, strict=True)
            ],
            "balanced_by": part.by,
            "microbatches": m,
            "remat": self.remat,
            "bubble_formula": (k - 1) / (m + k - 1),
        }

    def call(self, inputs, training=None):
        h = inputs
        for stage, device in zip(self.stages, self.devices, strict=True):
            with tf.device(device):
                h = stage(h, training=training)
        return h

    def unsplit_weights(self, model: keras.Model) -> list:
        """The stages' weights in the order of ``model.get_weights()``, ``model`` being the
        unsplit model (or a copy of it): each of its layers takes its namesake's."""
        layers = {
            layer.name: layer
            for stage in self.stages
            for layer in stage.layers
            if not isinstance(layer, keras.layers.InputLayer)
        }
        return [
            w
            for layer in model.layers
            if layer.name in layers
            for w in layers[layer.name].get_weights()
        ]

    def pipelined_forward(self, x):
        """The training forward pass: micro-batch by micro-batch through the stages.

        Raises:
            tf.errors.InvalidArgumentError: a batch of fewer examples than micro-batches (an
                empty micro-batch; give ``fit`` batches of at least M examples).
        """
        n = tf.shape(x)[0]
        tf.debugging.assert_greater_equal(
            n,
            self.microbatches,
            message=f"a batch smaller than the {self.microbatches} micro-batches it is split into",
        )
        sizes = microbatch_sizes(n, self.microbatches)
        parts = tf.split(x, sizes, num=self.microbatches)
        calls = [self._stage_call(stage) for stage in self.stages]
        outputs = []
        for part in parts:
            h = part
            for call, device in zip(calls, self.devices, strict=True):
                with tf.device(device):
                    h = call(h)
            outputs.append(h)
        with tf.device(self.devices[-1]):
            return tf.concat(outputs, 0)

    def _stage_call(self, stage):
        def run(h):
            return stage(h, training=True)

        return tf.recompute_grad(run) if self.remat else run

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self.pipelined_forward(x)
            loss = self.compute_loss(x, y, y_pred, sample_weight)
        self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
        return self.compute_metrics(x, y, y_pred, sample_weight)


def split(model: keras.Model, runtime, macs: Callable | None = None) -> Pipelined:
    """``model`` split as ``runtime`` (a :class:`~tfopt.config.RuntimeConfig`) says: ``stages``,
    ``microbatches`` (0 = 4K), ``balance``, ``cut_after`` (comma-separated) and ``remat``
    (``macs``: the multiply-add counter ``balance="flops"`` uses)."""
    k = runtime.stages
    cut = [name.strip() for name in runtime.cut_after.split(",") if name.strip()]
    part = partition(model, k, by=runtime.balance, cut_after=cut, macs=macs)
    devices = stage_devices(k)
    stages = build_stages(model, part, devices)
    return Pipelined(stages, devices, runtime.microbatches or 4 * k, runtime.remat, part)


def copy_weights_back(pipelined: Pipelined, model: keras.Model) -> None:
    """Sets ``model``'s layers to the stages' weights (matched by layer name)."""
    model.set_weights(pipelined.unsplit_weights(model))
