"""Which output channels of a functional model must be removed together, and which cannot be.

Each output channel of a Conv2D, SeparableConv2D or Dense layer gets an id. The ids flow through
the graph: layers that act on each channel alone (batch norm, activations, pooling, padding,
dropout, a depthwise convolution) pass them on; ``Flatten`` repeats them once per position;
``Concatenate`` joins the lists; ``Add``, ``Multiply`` (squeeze-and-excitation), ``Subtract``,
``Maximum``, ``Minimum`` and ``Average`` tie the ids at each position into one class, which is
pruned as a whole. The model's inputs and outputs, and whatever a layer the tracer does not know
takes or gives, are pinned: kept whole, with the layer named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tfopt.core._keras import keras

L = keras.layers
PRODUCERS = (L.SeparableConv2D, L.DepthwiseConv2D, L.Conv2D, L.Dense)  # checked in this order
ELEMENTWISE = (
    L.BatchNormalization,
    L.ReLU,
    L.LeakyReLU,
    L.ELU,
    L.Activation,
    L.Dropout,
    L.SpatialDropout2D,
    L.MaxPooling2D,
    L.AveragePooling2D,
    L.GlobalAveragePooling2D,
    L.GlobalMaxPooling2D,
    L.ZeroPadding2D,
    L.Cropping2D,
    L.UpSampling2D,
    L.GaussianNoise,
    L.GaussianDropout,
    L.ActivityRegularization,
)
JOINS = (L.Add, L.Subtract, L.Multiply, L.Maximum, L.Minimum, L.Average)


@dataclass
class Channels:
    """The channel ids of every layer's output, their classes, and what is pinned.

    Attributes:
        out: Layer name -> the id of each channel (feature, after ``Flatten``) of its output.
        producers: Producer layer name -> the ids of its own output channels, in order.
        pinned: Ids that must stay (their class is kept whole).
        why: Layer name -> why its channels (or its inputs') are pinned.
    """

    out: dict[str, list[int]] = field(default_factory=dict)
    producers: dict[str, list[int]] = field(default_factory=dict)
    pinned: set[int] = field(default_factory=set)
    why: dict[str, str] = field(default_factory=dict)
    parent: list[int] = field(default_factory=list)
    pinned_by: dict[int, str] = field(default_factory=dict)

    def fresh(self, n: int, pinned: bool = False) -> list[int]:
        """``n`` new ids."""
        ids = list(range(len(self.parent), len(self.parent) + n))
        self.parent.extend(ids)
        if pinned:
            self.pinned.update(ids)
        return ids

    def find(self, i: int) -> int:
        """The class of id ``i`` (its union-find root)."""
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        """Ties ids ``a`` and ``b`` into one class."""
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def pin(self, ids, layer: str, reason: str) -> None:
        """Pins ``ids`` and records why, under ``layer``."""
        ids = list(ids)
        if ids:
            self.pinned.update(ids)
            self.why.setdefault(layer, reason)
            for i in ids:
                self.pinned_by.setdefault(i, layer)

    def kept_whole(self, producer: str) -> list[str]:
        """The layers that pin channels of ``producer`` (empty: all of them can be pruned)."""
        by_root = {}
        for i in self.pinned:
            by_root.setdefault(self.find(i), self.pinned_by.get(i, "input"))
        return sorted(
            {by_root[self.find(i)] for i in self.producers[producer] if self.find(i) in by_root}
        )

    def classes(self) -> dict[int, list[tuple[str, int]]]:
        """Prunable class -> its members ``(producer, channel index)``; pinned classes left out."""
        pinned = {self.find(i) for i in self.pinned}
        out: dict[int, list[tuple[str, int]]] = {}
        for name, ids in self.producers.items():
            for index, i in enumerate(ids):
                root = self.find(i)
                if root not in pinned:
                    out.setdefault(root, []).append((name, index))
        return out


def _channels_last(layer) -> bool:
    return getattr(layer, "data_format", "channels_last") == "channels_last"


def _last_dim(shape) -> int:
    return int(shape[-1]) if shape and shape[-1] is not None else 0


def trace(model: keras.Model) -> Channels:
    """Traces the channel ids of a functional model (see the module docstring).

    Args:
        model: A functional tf_keras model (:func:`tfopt.compress.surgery.functional`).
    """
    ch = Channels()
    config = {e["name"]: e for e in model.get_config()["layers"]}
    for layer in model.layers:
        name = layer.name
        nodes = config[name]["inbound_nodes"]
        refs = [ref for node in nodes for ref in node]
        shape = layer.output_shape if len(nodes) <= 1 else None
        if isinstance(shape, list):
            shape = shape[0] if len(shape) == 1 else None
        width = _last_dim(shape) if shape is not None else 0
        if isinstance(layer, L.InputLayer):
            ch.out[name] = ch.fresh(width, pinned=True)
            continue
        inputs = [ch.out.get(ref[0], []) for ref in refs]
        if len(nodes) != 1 or any(ref[2] != 0 for ref in refs) or shape is None:
            for ids in inputs:
                ch.pin(ids, name, "shared layer or several outputs")
            ch.out[name] = ch.fresh(width, pinned=True)
            ch.why.setdefault(name, "shared layer or several outputs")
            continue
        ch.out[name] = _through(ch, layer, inputs, width)
    for name in model.output_names:
        ch.pin(ch.out[name], name, "model output")
    return ch


def _unknown(ch: Channels, layer, inputs: list[list[int]], width: int, reason: str) -> list[int]:
    for ids in inputs:
        ch.pin(ids, layer.name, reason)
    ch.why.setdefault(layer.name, reason)
    return ch.fresh(width, pinned=True)


def _through(ch: Channels, layer, inputs: list[list[int]], width: int) -> list[int]:
    """The ids of ``layer``'s output from its inputs' (recording pins and classes)."""
    first = inputs[0] if inputs else []
    if isinstance(layer, PRODUCERS) and not _channels_last(layer):
        return _unknown(ch, layer, inputs, width, "channels_first layout")
    if isinstance(layer, L.DepthwiseConv2D):
        if layer.depth_multiplier != 1:
            return _unknown(ch, layer, inputs, width, "depth multiplier above 1")
        return list(first)
    if isinstance(layer, PRODUCERS):
        if (
            isinstance(layer, L.Conv2D)
            and not isinstance(layer, L.SeparableConv2D)
            and layer.groups != 1
        ):
            return _unknown(ch, layer, inputs, width, "grouped convolution")
        ids = ch.fresh(width)
        ch.producers[layer.name] = ids
        return ids
    if isinstance(layer, L.BatchNormalization) and layer.axis not in (
        [-1],
        [len(layer.input_shape) - 1],
    ):
        return _unknown(ch, layer, inputs, width, "batch norm over another axis than the channels")
    if isinstance(layer, L.Activation) and layer.get_config()["activation"] in (
        "softmax",
        "log_softmax",
    ):
        return _unknown(ch, layer, inputs, width, "softmax mixes the channels")
    if isinstance(layer, ELEMENTWISE):
        return list(first)
    if isinstance(layer, JOINS):
        if len({len(ids) for ids in inputs}) != 1:
            return _unknown(ch, layer, inputs, width, "inputs of different widths")
        for ids in inputs[1:]:
            for a, b in zip(first, ids):
                ch.union(a, b)
        return list(first)
    if isinstance(layer, L.Concatenate):
        if layer.axis not in (-1, len(layer.output_shape) - 1):
            return _unknown(
                ch, layer, inputs, width, "concatenation over another axis than the channels"
            )
        return [i for ids in inputs for i in ids]
    if isinstance(layer, L.Flatten) and layer.data_format == "channels_first":
        return _unknown(ch, layer, inputs, width, "channels_first flattening")
    if isinstance(layer, (L.Flatten, L.Reshape)):
        shape_in = layer.input_shape
        if isinstance(layer, L.Reshape) and _last_dim(shape_in) == width:
            return list(first)  # e.g. squeeze-and-excitation's (C,) -> (1, 1, C)
        if len(layer.output_shape) == 2 and len(first) and width % len(first) == 0:
            return list(first) * (width // len(first))  # channels_last flattening: position-major
        return _unknown(ch, layer, inputs, width, "reshape that moves the channels")
    return _unknown(ch, layer, inputs, width, f"{type(layer).__name__} is not traced")
