"""Run configuration: frozen dataclasses, strict YAML/JSON loading and CLI overrides.

Configuration is plain data validated here, at the edge; inner code trusts it.
"""

# ruff: noqa: F405 - the public names come from the modules star-imported below
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Every name of the config's modules is a name of tfopt.config (its one public import path).
from tfopt.config.checks import _validate, choosers, reads, teacher_weights  # noqa: F401
from tfopt.config.distill import *  # noqa: F403
from tfopt.config.distill import COMBINE_MODES, DISTILL_TECHNIQUES, DistillConfig  # noqa: F401
from tfopt.config.export import *  # noqa: F403
from tfopt.config.export import ExportConfig
from tfopt.config.federated import FederatedConfig
from tfopt.config.fields import *  # noqa: F403
from tfopt.config.optimize import *  # noqa: F403
from tfopt.config.optimize import OptimizeConfig
from tfopt.config.privacy import PrivacyConfig
from tfopt.config.sections import *  # noqa: F403
from tfopt.config.sections import HEADS, DataConfig, ModelConfig, RuntimeConfig, TrainConfig  # noqa: F401
from tfopt.config.values import *  # noqa: F403
from tfopt.config.values import _field_types, choices_of, coerce  # noqa: F401
from tfopt.core.errors import ConfigError

#: The public names: the tree and its sections, reading and overriding it, the values parsed from
#: text, and the command lines made from it (``cli``).
__all__ = [
    "RunConfig",
    "DataConfig",
    "ModelConfig",
    "RuntimeConfig",
    "TrainConfig",
    "DistillConfig",
    "OptimizeConfig",
    "ExportConfig",
    "PrivacyConfig",
    "FederatedConfig",
    "STAGE_SECTIONS",
    "TRAINING_SECTIONS",
    "Flag",
    "flag",
    "from_dict",
    "load",
    "apply_overrides",
    "choices_of",
    "default_data_dir",
    "parse_image_size",
    "parse_normalize",
    "parse_features",
    "parse_modes",
    "parse_threads",
    "cli",
]


@dataclass(frozen=True)
class RunConfig:
    """Everything one ``python -m tfopt.train`` run needs."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    optimize: OptimizeConfig = field(default_factory=OptimizeConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    federated: FederatedConfig = field(default_factory=FederatedConfig)

    def to_dict(self, stage: str | None = None) -> dict:
        """Returns the config as nested plain dicts (JSON-serializable).

        Args:
            stage: Only the sections this stage reads (:data:`STAGE_SECTIONS`); None = all.
        """
        out = dataclasses.asdict(self)
        if stage is None:
            return out
        return {k: v for k, v in out.items() if k in STAGE_SECTIONS.get(stage, TRAINING_SECTIONS)}


#: The sections every training-like stage reads.
TRAINING_SECTIONS = ("data", "model", "runtime", "train")
#: The sections each stage reads: its run record and its resume fingerprint hold only these.
STAGE_SECTIONS = {
    "train": (*TRAINING_SECTIONS, "privacy"),
    "distill": (*TRAINING_SECTIONS, "distill", "privacy"),
    # optimize resolves its section into the run.json "optimize" record (the settings each
    # technique ran with), which its fingerprint covers
    "optimize": TRAINING_SECTIONS,
    # clients train on one device each: no runtime section
    "federated": ("data", "model", "train", "federated"),
}


def from_dict(raw: Mapping[str, Any], base: RunConfig | None = None) -> RunConfig:
    """Builds a RunConfig from nested dicts, rejecting unknown sections and keys.

    Args:
        raw: ``{"data": {...}, "model": {...}, "runtime": {...}, "train": {...}}``; any subset.
        base: Values not given in ``raw`` come from here (defaults when None).

    Returns:
        A validated, frozen RunConfig.

    Raises:
        ConfigError: unknown section or key (the message lists the valid ones), wrong type
            or a value outside its valid range.
    """
    base = base or RunConfig()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"a config must be a mapping of sections, got {type(raw).__name__}")
    sections = {f.name: getattr(base, f.name) for f in dataclasses.fields(RunConfig)}
    for section, values in raw.items():
        if section not in sections:
            raise ConfigError(
                f"unknown config section {section!r}; valid sections: {', '.join(sections)}"
            )
        if values is None:
            continue
        if not isinstance(values, Mapping):
            raise ConfigError(
                f"config section {section!r} must be a mapping of keys, got {values!r}"
            )
        current = sections[section]
        types = _field_types(type(current))
        updates = {}
        for key, value in values.items():
            if key not in types:
                raise ConfigError(
                    f"unknown key {section}.{key!s}; valid keys in {section!r}: {', '.join(types)}"
                )
            updates[key] = coerce(section, key, value, types[key])
        sections[section] = dataclasses.replace(current, **updates)
    return _validate(RunConfig(**sections))


#: The largest config file :func:`load` reads.
MAX_CONFIG_FILE_BYTES = 1024 * 1024


def load(path: str, base: RunConfig | None = None) -> RunConfig:
    """Loads a YAML (.yaml/.yml) or JSON (.json) config file strictly.

    Args:
        path: The file to read.
        base: Defaults for keys the file does not set.

    Returns:
        A validated RunConfig.

    Raises:
        ConfigError: the file is missing, unparsable, or has unknown keys or bad values.
    """
    if not os.path.isfile(path):
        raise ConfigError(
            f"config file {path!r} does not exist; give the path of a .yaml or .json file"
        )
    if not path.endswith((".yaml", ".yml", ".json")):
        raise ConfigError(f"config file {path!r} must end in .yaml, .yml or .json")
    import yaml

    size = os.path.getsize(path)
    if size > MAX_CONFIG_FILE_BYTES:
        raise ConfigError(
            f"config file {path!r} is {size} bytes (at most {MAX_CONFIG_FILE_BYTES}); a config "
            "is a few hundred lines: give the right file"
        )
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise ConfigError(
            f"config file {path!r} is not UTF-8 text; give a .yaml or .json file"
        ) from None
    try:
        raw = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        first = str(e).strip().splitlines()[0]
        raise ConfigError(
            f"config file {path!r} cannot be parsed: {first}; fix its syntax"
        ) from None
    return from_dict(raw or {}, base)


def apply_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """Applies ``section.key=value`` overrides (from ``--set``) on top of a config.

    Args:
        cfg: The config to start from.
        overrides: Strings like ``"data.cache=none"``.

    Returns:
        A new validated RunConfig.

    Raises:
        ConfigError: malformed override, unknown key or bad value.
    """
    raw: dict[str, dict[str, str]] = {}
    for item in overrides:
        name, sep, value = item.partition("=")
        section, dot, key = name.strip().partition(".")
        if not sep or not dot or not key:
            raise ConfigError(
                f"override {item!r} is not of the form section.key=value (e.g. data.cache=none)"
            )
        raw.setdefault(section, {})[key] = value.strip()
    return from_dict(raw, cfg)
