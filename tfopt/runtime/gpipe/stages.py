"""Where a model is cut into pipeline stages, and the stage models built on their devices."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tfopt.core._keras import keras, tf

from tfopt.core.errors import ConfigError

#: How ``partition`` weighs the layers when it balances the stages.
BALANCE = ("time", "params", "flops")


@dataclass(frozen=True)
class Partition:
    """Where a model is cut.

    Attributes:
        stages: The layer names of each stage, in the model's order.
        outputs: The layer whose output leaves each stage (the last: the model's output).
        costs: Each stage's summed cost, in the unit of ``by``.
        by: ``time`` (seconds measured per piece), ``params``, ``flops`` or ``names`` (cut where
            the user said).
    """

    stages: tuple[tuple[str, ...], ...]
    outputs: tuple[str, ...]
    costs: tuple[float, ...]
    by: str

    def to_dict(self) -> dict:
        """The partition as JSON (a resumed run cuts where this says)."""
        return {"stages": self.stages, "outputs": self.outputs, "costs": self.costs, "by": self.by}

    @classmethod
    def from_dict(cls, data: dict) -> Partition:
        """The partition :meth:`to_dict` wrote."""
        return cls(
            tuple(tuple(names) for names in data["stages"]),
            tuple(data["outputs"]),
            tuple(float(c) for c in data["costs"]),
            data["by"],
        )


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
    seconds: dict[str, float] | None = None,
) -> Partition:
    """Splits ``model``'s layers into ``stages`` contiguous stages.

    Args:
        model: A functional or Sequential tf_keras model with one input and one output.
        stages: K, the number of stages (>= 1).
        by: ``time``, ``params`` or ``flops``: the stages' largest summed cost is made as small
            as the model's cut points allow. Ignored when ``cut_after`` is given.
        cut_after: The layers after which to cut (K-1 names), instead of balancing.
        macs: ``macs(layer, model)``, a layer's multiply-adds per example, for ``by="flops"``
            (:func:`tfopt.compress.flops.layer_macs`).
        seconds: ``{layer name: seconds}`` for ``by="time"``, as
            :func:`tfopt.runtime.gpipe.cost.piece_seconds` measures them (layers not named cost 0).

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
        costs = _costs(graph, by, macs, seconds)
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


def _costs(graph: _Graph, by: str, macs: Callable | None, seconds: dict | None) -> list[float]:
    """Each layer's cost in the unit of ``by``, in the graph's order."""
    if by == "time":
        if seconds is None:
            raise TypeError("partition(by='time') needs seconds=, the measured piece times")
        return [float(seconds.get(n, 0.0)) for n in graph.order]
    cost = _params if by == "params" else macs
    if cost is None:
        raise TypeError("partition(by='flops') needs macs=, a multiply-add counter")
    layers = {layer.name: layer for layer in graph.model.layers}
    return [float(cost(layers[n], graph.model)) for n in graph.order]


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
