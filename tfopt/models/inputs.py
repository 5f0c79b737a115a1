"""The model's input side: the pixel range its first layers expect, read from the graph.

A model may carry its own preprocessing (``Rescaling(1/255)`` as keras.io writes it, an adapted
``Normalization``, the ``keras.applications`` families that scale inside: EfficientNet(V2),
ConvNeXt, RegNet, ResNetRS, MobileNetV3), possibly behind ``Resizing``, ``CenterCrop`` or
augmentation layers. tfopt does not read layer settings one class at a time: it cuts the graph
at the first layer with trainable weights (nested models included), runs what comes before it
on probe images of known constant pixels, and fits ``y = a * pixel + b`` per channel. From that
map it decides what the data must feed (``data.input_scale``):

- ``raw``: 0-255 pixels, when the map brings 0-255 to a range of order one (``a * 255`` near 1-4);
- ``unit``: pixels / 255, when it brings [0, 1] there (e.g. ``Normalization`` adapted on [0, 1]),
  or when the input side does not scale at all (the default of every other model).

:func:`resolve` applies the decision to the data config (``auto``), or checks the user's
``--input-scale`` against it (a contradiction is a one-line error); :func:`probe` looks at the
values the first weighted layer receives from a real batch and warns when they are near zero or
far outside [-5, 5], which catches what the graph cannot say (a factory model, a wrong
``data.normalize``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tfopt.core._keras import keras

import numpy as np

from tfopt.config import DataConfig, is_raw_normalize, parse_normalize, reverses_channels
from tfopt.core.errors import ConfigError, ModelError

log = logging.getLogger(__name__)

# Probe images: one constant pixel value per channel (channel independence is checked too).
_PROBES = ((0.0, 0.0, 0.0), (255.0, 255.0, 255.0), (10.0, 100.0, 200.0), (200.0, 10.0, 100.0))
# The output span (range of the first layer's input) a scaling step aims at: [0, 1] is 1, [-1, 1]
# is 2, a standardization about 4. The candidate feed whose span is nearest (in log) wins.
_TARGET_SPAN = 2.0
# probe(): the first weighted layer's input is suspicious when every value is this close to zero
# (pixels scaled twice: at most 1/255) or when some value is this far from zero (unscaled pixels).
NEAR_ZERO = 1.5 / 255.0
FAR = 20.0


@dataclass(frozen=True)
class InputSide:
    """What the layers before the first weighted layer do to pixels.

    Attributes:
        layers: ``"name (Class)"`` of every layer before the first weighted one (inputs excluded).
        first: The first layer with trainable weights (``"name (Class)"``); ``""`` when none.
        scale: Per channel ``a`` of ``y = a * pixel + b`` (pixel in 0-255); empty: not affine.
        offset: Per channel ``b``.
        size: The spatial size the first weighted layer receives, when the input side changes it.
    """

    layers: tuple[str, ...]
    first: str
    scale: tuple[float, ...]
    offset: tuple[float, ...]
    size: tuple[int, int] | None = None

    @property
    def readable(self) -> bool:
        """True when the input side is an affine map per channel (tfopt can tell what it expects)."""
        return bool(self.scale)

    @property
    def scales(self) -> bool:
        """True when the input side changes pixel values (not the identity)."""
        return self.readable and not (
            all(abs(a - 1.0) < 1e-3 for a in self.scale)
            and all(abs(b) < 1e-3 * 255 for b in self.offset)
        )

    @property
    def expects(self) -> str | None:
        """``raw`` or ``unit`` (see the module doc); None when the input side does not scale."""
        if not self.scales:
            return None
        span = max(abs(a) for a in self.scale)
        distance = {
            feed: abs(math.log10(max(span * width, 1e-12)) - math.log10(_TARGET_SPAN))
            for feed, width in (("raw", 255.0), ("unit", 1.0))
        }
        return min(distance, key=distance.get)

    def summary(self) -> str:
        """One phrase: the scaling layers and their map, e.g. ``Rescaling 'rescaling': x * 0.00392 + 0``."""
        named = [name for name in self.layers if not name.endswith("(InputLayer)")]
        where = ", ".join(named) or "no layer"
        if not self.readable:
            return f"{where} (not a per-channel scale and shift)"
        return f"{where}: pixel * {_values(self.scale)} + {_values(self.offset)}"

    def to_dict(self) -> dict:
        """Plain data for the run record."""
        return {
            "layers": list(self.layers),
            "first_weighted_layer": self.first,
            "scale": [round(v, 8) for v in self.scale],
            "offset": [round(v, 8) for v in self.offset],
            "size": list(self.size) if self.size else None,
            "expects": self.expects,
        }


def _values(values: Sequence[float]) -> str:
    """Per-channel values at 4 digits, one when they agree (``0.003922``, ``-2.118,-2.036,-1.804``)."""
    shown = [f"{0.0 if abs(v) < 1e-6 else v:.4g}" for v in values]
    return shown[0] if len(set(shown)) == 1 else ",".join(shown)


def _label(layer) -> str:
    return f"{layer.name} ({type(layer).__name__})"


def _weighted(layer) -> bool:
    """A layer that learns: it holds a trainable variable (Normalization's and the random layers'
    state variables are not trainable, so they count as preprocessing)."""
    return any(getattr(v, "trainable", False) for v in layer.weights)


def _head(model: keras.Model, layer) -> keras.Model:
    """The part of ``model`` from its input to ``layer``'s input. A layer called in several graphs
    (a nested model always is: its own graph first) has one input per call: the one reachable
    from ``model``'s input is taken."""
    index = 0
    while True:
        tensor = layer.get_input_at(index)  # ValueError past the last call
        try:
            return keras.Model(model.inputs, tensor)
        except ValueError:  # another graph's tensor ("Graph disconnected")
            index += 1


def _cut(model: keras.Model) -> tuple[list[Callable], list[str], str]:
    """The functions from the model's input to its first weighted leaf layer's input (one per
    nesting level), the layers passed on the way, and that layer's label."""
    passed: list[str] = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        if not _weighted(layer):
            passed.append(_label(layer))
            continue
        head = _head(model, layer)
        if isinstance(layer, keras.Model) and len(layer.inputs) == 1:
            inner, inner_passed, first = _cut(layer)
            return [head, *inner], passed + inner_passed, first
        return [head], passed, _label(layer)
    return [], passed, ""


def measure(model: keras.Model, image_shape: Sequence[int]) -> InputSide:
    """Runs the model's input side on probe images of ``image_shape`` and fits its per-channel map.

    Args:
        model: A tf_keras model with one image input.
        image_shape: ``(H, W, C)`` of the images the data gives.

    Returns:
        The input side (``scale`` empty when it is not affine per channel, or cannot be cut).
    """
    try:
        steps, passed, first = _cut(model)
    except (AttributeError, ValueError):  # a shared layer (several inbound nodes): no one input
        return InputSide(tuple(_label(l) for l in model.layers[:3]), "", (), ())
    if not steps:
        return InputSide(tuple(passed), first, (), ())
    x = probe_images(image_shape)
    for step in steps:
        x = step(x, training=False)
    return fit(np.asarray(x, np.float64), passed, first, image_shape)


def probe_images(image_shape: Sequence[int]) -> np.ndarray:
    """The probe images for an ``(H, W, C)`` input: one constant pixel value per channel each."""
    h, w, c = (int(d) for d in image_shape)
    pixels = np.array([(p * c)[:c] for p in _PROBES], np.float32)  # [probe, channel]
    return np.broadcast_to(pixels[:, None, None, :], (len(_PROBES), h, w, c)).astype(np.float32)


def fit(y: np.ndarray, passed: Sequence[str], first: str, image_shape: Sequence[int]) -> InputSide:
    """The input side from what it made of :func:`probe_images` (``y``, one row per probe).

    Args:
        y: The first weighted layer's input for each probe image.
        passed: ``"name (Class)"`` of the layers before it.
        first: That layer's label.
        image_shape: ``(H, W, C)`` of the probe images.
    """
    h, w, c = (int(d) for d in image_shape)
    pixels = probe_images(image_shape)[:, 0, 0, :]
    size = tuple(int(d) for d in y.shape[1:3]) if y.ndim == 4 else None
    if y.ndim != 4 and y[0].size == h * w * c:  # Flatten, Reshape: the same values, rearranged
        y = y.reshape(len(_PROBES), h, w, c)
    elif y.ndim != 4 and y.shape[-1] == c:  # a global pooling: one value per channel
        y = y.reshape(len(_PROBES), 1, 1, c)
    if y.ndim != 4 or y.shape[-1] != c:
        return InputSide(tuple(passed), first, (), (), size)
    mean = y[:, y.shape[1] // 2, y.shape[2] // 2, :]  # the centre: padding only adds borders
    scale, offset = [], []
    for ch in range(c):
        a, b = np.polyfit(pixels[:, ch], mean[:, ch], 1)
        fitted = a * pixels[:, ch] + b
        if np.abs(fitted - mean[:, ch]).max() > 1e-2 * (np.ptp(mean[:, ch]) + 1e-6):
            return InputSide(tuple(passed), first, (), (), size)
        scale.append(float(a))
        offset.append(float(b))
    changed = size if size != (h, w) else None
    return InputSide(tuple(passed), first, tuple(scale), tuple(offset), changed)


def _flag(requested: str, origin: str) -> str:
    return f"--input-scale {requested}" if origin == "flag" else f"data.input_scale={requested}"


def resolve(
    data: DataConfig, side: InputSide, model_name: str, origin: str = "flag"
) -> tuple[DataConfig, dict]:
    """The data config with ``input_scale`` settled (``unit`` or ``raw``) for a model whose input
    side is ``side``, and what decided it (for the run record and the report).

    ``auto`` takes what the graph expects (``unit`` when it does not scale); an explicit ``unit``
    or ``raw`` must not contradict a graph that scales. A ``data.normalize`` that gives 0-255
    pixels counts as ``raw``.

    Args:
        data: The data section (``input_scale`` ``auto``, ``unit`` or ``raw``).
        side: :func:`measure`'s result for the model.
        model_name: The model's name for messages (``--model`` or the input run).
        origin: Where an explicit ``input_scale`` came from: ``flag`` or ``config``/``run``.

    Raises:
        ModelError: ``auto`` and an input side tfopt cannot read (its layers are named).
        ConfigError: an explicit scale, or a ``data.normalize``, that contradicts the graph.
    """
    requested = data.input_scale
    expects = side.expects
    if requested != "unit" and is_raw_normalize(
        data.normalize
    ):  # 0-255 pixels, spelled as a normalize
        data = dataclasses.replace(data, normalize="")
        requested = "raw"
    if requested == "auto" and not side.readable and side.layers and side.first:
        raise ModelError(
            f"model {model_name!r} transforms its input before {side.first or 'its output'} in a "
            f"way tfopt cannot read ({', '.join(side.layers)}); say what it expects with "
            "--input-scale unit (pixels / 255) or --input-scale raw (0-255 pixels)"
        )
    if requested == "auto":
        if expects == "raw" and data.normalize:
            raise ConfigError(
                f"data.normalize={data.normalize!r} rescales pixels for model {model_name!r}, which "
                f"scales its own input ({side.summary()}) and expects 0-255 pixels; drop "
                "data.normalize, or give --input-scale unit to keep it"
            )
        chosen, decided = expects or "unit", "graph" if expects else "default"
    else:
        if expects and expects != requested:
            what = "0-255 pixels" if expects == "raw" else "pixels / 255"
            raise ConfigError(
                f"{_flag(requested, origin)} contradicts model {model_name!r}: its input side "
                f"({side.summary()}) expects {what}; give --input-scale {expects} or auto"
            )
        chosen, decided = requested, origin
    data = dataclasses.replace(data, input_scale=chosen)
    return data, {"input_scale": chosen, "decided_by": decided, **side.to_dict()}


def probe(model: keras.Model, images) -> str | None:
    """One warning line when the model's first weighted layer receives values that look wrong.

    Runs the input side (see :func:`measure`) on ``images``, a batch exactly as the data pipeline
    gives it. Values all within ``NEAR_ZERO`` of zero mean pixels scaled twice; values beyond
    ``FAR`` mean pixels that reached the weights unscaled.

    Returns:
        The warning (what was seen, the likely cause, the flag that fixes it), or None.
    """
    try:
        steps, _, first = _cut(model)
    except (AttributeError, ValueError):
        return None
    x = images
    for step in steps:
        x = step(x, training=False)
    values = np.asarray(x, np.float64)
    if not first or values.size == 0 or not np.all(np.isfinite(values)):
        return None
    peak = float(np.abs(values).max())
    if peak <= NEAR_ZERO:
        return (
            f"the model's first weighted layer {first} receives values within {peak:.2g} of zero: "
            "the pixels are likely scaled twice (by the data and again inside the model); give "
            "--input-scale raw (0-255 pixels) or check data.normalize"
        )
    if peak > FAR:
        return (
            f"the model's first weighted layer {first} receives values up to {peak:.3g}, far "
            "outside [-5, 5]: the pixels likely reach it unscaled; give --input-scale unit "
            "(pixels / 255), or --set data.normalize=MEAN/STD"
        )
    return None


def settle(
    data: DataConfig,
    model: keras.Model,
    image_shape: Sequence[int],
    model_name: str,
    origin: str = "flag",
) -> tuple[DataConfig, dict]:
    """:func:`measure` then :func:`resolve`: the data config a stage feeds ``model`` with, and the
    record of the decision. Raises what :func:`resolve` raises."""
    return resolve(data, measure(model, image_shape), model_name, origin)


def probe_dataset(model: keras.Model, dataset) -> str | None:
    """:func:`probe` on the first batch of ``dataset`` (``(images, labels)`` batches)."""
    for images, _ in dataset.take(1):
        return probe(model, images)
    return None


def adopt(job, model: keras.Model, model_name: str, origin: str = "flag") -> dict:
    """Settles ``data.input_scale`` for ``model`` inside a running stage's
    :class:`~tfopt.runtime.job.Job` (every dataset made afterwards follows), and on the chief warns
    when the first validation batch reaches the first weighted layer near zero or unscaled.

    Returns:
        What decided the scale, for the run record. Raises what :func:`resolve` raises.
    """
    data, described = settle(job.cfg.data, model, job.info.image_shape, model_name, origin)
    job.use_data(data, described)
    if job.chief:
        warning = probe_dataset(model, job.dataset("validation"))
        if warning:
            log.warning(warning, extra={"prog": f"tfopt {job.stage}"})
    return described


def feed_map(data: DataConfig, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Per channel ``(a, b)`` with ``model input = a * pixel + b`` for a settled data section
    (``input_scale`` ``unit`` or ``raw``, and ``data.normalize``); the channels' order aside."""
    if data.input_scale == "raw":
        return np.ones(channels), np.zeros(channels)
    mean, std = parse_normalize(data.normalize) or ((0.0,), (1.0,))
    mean = np.broadcast_to(np.asarray(mean, np.float64), (channels,))
    std = np.broadcast_to(np.asarray(std, np.float64), (channels,))
    return 1.0 / (255.0 * std), -mean / std


def adapted(model: keras.Model, fed: DataConfig, expects: DataConfig, what: str) -> keras.Model:
    """``model`` (which expects the inputs ``expects`` gives) taking the inputs ``fed`` gives:
    a fixed per-channel ``Rescaling`` in front when the two differ, ``model`` itself otherwise.
    A distillation teacher trained on other inputs than the student's sees its own.

    Raises:
        ConfigError: one of them reverses the channels (BGR) and the other does not.
    """
    if reverses_channels(fed.normalize) != reverses_channels(expects.normalize):
        raise ConfigError(
            f"{what} takes {'BGR' if reverses_channels(expects.normalize) else 'RGB'} inputs but the "
            f"data gives {'BGR' if reverses_channels(fed.normalize) else 'RGB'}; give models that "
            "take the same channel order"
        )
    channels = int(model.input_shape[-1])
    (a_f, b_f), (a_t, b_t) = feed_map(fed, channels), feed_map(expects, channels)
    if np.allclose(a_f, a_t, rtol=1e-6) and np.allclose(b_f, b_t, atol=1e-6):
        return model
    scale = a_t / a_f
    offset = b_t - scale * b_f
    inputs = keras.Input(model.input_shape[1:])
    x = keras.layers.Rescaling(
        [float(v) for v in scale], [float(v) for v in offset], name=f"{model.name}_input_adapter"
    )(inputs)
    return keras.Model(inputs, model(x), name=model.name)
