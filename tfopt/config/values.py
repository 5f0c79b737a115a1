"""Reading config values: choices, types, and the fields parsed from text."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from tfopt.config.distill import COMBINE_MODES, DISTILL_TECHNIQUES
from tfopt.config.export import ExportConfig
from tfopt.config.federated import FederatedConfig
from tfopt.config.fields import (
    ALLREDUCE_DTYPES,
    AUGMENTS,
    BGR_PREFIX,
    CACHE_MODES,
    COLLECTIVES,
    FLAG,
    INPUT_SCALES,
    NORMALIZE_PRESETS,
    PARTITIONERS,
    RAW_NORMALIZE,
    SERVICE_MODES,
)
from tfopt.config.optimize import OptimizeConfig
from tfopt.config.sections import HEADS, DataConfig
from tfopt.core.errors import ConfigError
from tfopt.core.specs import PRECISIONS, STRATEGIES

_CHOICES = {
    ("runtime", "strategy"): STRATEGIES.names(),
    ("runtime", "precision"): PRECISIONS.names(),
    ("runtime", "collective"): COLLECTIVES,
    ("runtime", "allreduce_dtype"): ALLREDUCE_DTYPES,
    ("runtime", "variable_partitioner"): PARTITIONERS,
    ("runtime", "balance"): ("time", "params", "flops"),
    ("runtime", "schedule"): ("gpipe", "1f1b"),
    ("data", "cache"): CACHE_MODES,
    ("data", "augment"): AUGMENTS,
    ("data", "service_mode"): SERVICE_MODES,
    ("train", "lr_schedule"): ("constant", "cosine"),
    ("model", "head"): HEADS,
    ("data", "channels"): (0, 1, 3),
    ("data", "input_scale"): INPUT_SCALES,
    ("distill", "combine"): COMBINE_MODES,
    ("distill", "technique"): DISTILL_TECHNIQUES,
}


# A stage field whose option lists its choices (argparse enforces them) is checked against them
# in files and --set too.
_CHOICES |= {
    (section, f.name): f.metadata[FLAG].choices
    for section, cls in (
        ("optimize", OptimizeConfig),
        ("export", ExportConfig),
        ("federated", FederatedConfig),
    )
    for f in dataclasses.fields(cls)
    if FLAG in f.metadata and f.metadata[FLAG].choices
}


def choices_of(section: str, key: str) -> tuple | None:
    """The values ``section.key`` may take, when it is a choice (None otherwise)."""
    choices = _CHOICES.get((section, key))
    return tuple(choices) if choices is not None else None


def _field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def coerce(section: str, key: str, value: Any, typ: Any) -> Any:
    """``value`` (from YAML, JSON or a ``--set`` string) as type ``typ`` for ``section.key``.

    Raises:
        ConfigError: the value cannot be read as that type (one line naming it).
    """
    where = f"{section}.{key}"
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where}={value!r} is not a boolean; use true or false")
    if typ in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{where}={value!r} is not a number; give a {typ.__name__}")
        try:
            out = typ(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(
                f"{where}={value!r} is not {'an int' if typ is int else 'a float'}; give a number"
            ) from None
        if typ is float and not math.isfinite(out):
            raise ConfigError(f"{where}={value!r} is not a finite number; give a number")
        if typ is int and isinstance(value, float) and value != out:
            raise ConfigError(f"{where}={value!r} is not a whole number; give an int")
        return out
    if not isinstance(value, str):
        raise ConfigError(f"{where}={value!r} is not a string; give text")
    return value


def parse_normalize(text: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Reads ``data.normalize``: ``""`` -> None, ``imagenet`` or ``MEAN/STD`` -> (means, stds).

    A ``bgr:`` prefix reverses the channels first (``MEAN``/``STD`` then in BGR order; see
    ``reverses_channels``). ``MEAN`` and ``STD`` are comma-separated per-channel values in units of the [0, 1] image (one
    value applies to every channel), e.g. ``0.485,0.456,0.406/0.229,0.224,0.225``.

    Raises:
        ConfigError: malformed text or a standard deviation that is not > 0.
    """
    text = text.strip()
    if text.startswith(BGR_PREFIX):
        text = text[len(BGR_PREFIX) :]
    if not text:
        return None
    if text in NORMALIZE_PRESETS:
        return NORMALIZE_PRESETS[text]
    fix = (
        "give MEAN/STD per channel, e.g. 0.485,0.456,0.406/0.229,0.224,0.225, or one of "
        + ", ".join(NORMALIZE_PRESETS)
    )
    mean, sep, std = text.partition("/")
    try:
        values = tuple(tuple(float(v) for v in part.split(",")) for part in (mean, std))
    except ValueError:
        raise ConfigError(f"data.normalize={text!r} is not valid; {fix}") from None
    if (
        not sep
        or "/" in std
        or not all(v == v and abs(v) != float("inf") for part in values for v in part)
    ):
        raise ConfigError(f"data.normalize={text!r} is not valid; {fix}")
    if min(values[1]) <= 0:
        raise ConfigError(
            f"data.normalize={text!r} has a standard deviation <= 0; every STD value must be > 0"
        )
    return values


#: The largest side ``data.image_size`` takes (satellite tiles and medical scans stay below it).
MAX_IMAGE_SIDE = 8192


def parse_image_size(text: str) -> tuple[int, int] | None:
    """Reads ``data.image_size``: ``""`` -> None, ``HxW`` (or one number for a square) -> (H, W).

    Raises:
        ConfigError: not ``HxW`` with positive whole numbers.
    """
    text = text.strip().lower()
    if not text:
        return None
    parts = text.split("x")
    if len(parts) == 1:
        parts = parts * 2
    try:
        h, w = (int(p) for p in parts)
    except ValueError:
        h = w = 0
    if len(parts) != 2 or h < 1 or w < 1:
        raise ConfigError(
            f"data.image_size={text[:40]!r} is not valid; give HEIGHTxWIDTH in pixels, e.g. 96x96"
        )
    if max(h, w) > MAX_IMAGE_SIDE:
        raise ConfigError(
            f"data.image_size={text[:40]!r} is larger than {MAX_IMAGE_SIDE} pixels a side (one "
            f"image would take {4 * 3 * h * w / 2**30:.1f} GiB as float32); give e.g. 224x224"
        )
    return h, w


def feed_normalize(data: DataConfig) -> str:
    """The ``data.normalize`` the input pipeline applies: :data:`RAW_NORMALIZE` (pixels x 255 on
    [0, 1] images, so 0-255 again) for ``data.input_scale=raw``, else ``data.normalize``."""
    return RAW_NORMALIZE if data.input_scale == "raw" else data.normalize


def is_raw_normalize(normalize: str) -> bool:
    """True when ``data.normalize`` gives the model 0-255 pixels (mean 0, std 1/255 on every channel)."""
    values = parse_normalize(normalize) if not reverses_channels(normalize) else None
    return (
        bool(values)
        and all(abs(m) < 1e-9 for m in values[0])
        and all(abs(s * 255.0 - 1.0) < 1e-6 for s in values[1])
    )


def reverses_channels(normalize: str) -> bool:
    """True when ``data.normalize`` starts with ``bgr:``: the channels are reversed before normalizing."""
    return normalize.strip().startswith(BGR_PREFIX)


def _validate_augment(data: DataConfig) -> None:
    for key in ("crop_size", "crop_padding"):
        value = getattr(data, key)
        if value < 0:
            raise ConfigError(f"data.{key}={value} must be >= 0; give a number of pixels")
        if value and data.augment != "crop_flip":
            raise ConfigError(
                f"data.{key}={value} has no effect with data.augment={data.augment}; "
                f"set data.augment=crop_flip or leave data.{key} at 0"
            )
    parse_normalize(data.normalize)
    if data.input_scale == "raw" and data.normalize:
        raise ConfigError(
            f"data.input_scale=raw gives the model 0-255 pixels, but data.normalize={data.normalize!r} "
            "also scales them; leave data.normalize empty, or use --input-scale unit with it"
        )
