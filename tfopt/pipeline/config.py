"""What a pipeline runs: plain data, validated before TensorFlow starts.

A pipeline file (``pipelines/*.py``) defines ``get_config(variant) -> PipelineConfig`` and
``VARIANTS``. The config holds the base :class:`~tfopt.config.RunConfig` (data, runtime, train
settings every training stage shares) and one small spec per stage; ``--set KEY=VALUE``
overrides either: ``data.limit=2048`` and ``runtime.strategy=one_device`` go to the base,
``teacher.epochs=1``, ``student.alpha=0.5``, ``compress.techniques=pqat,prune_2of4``,
``export.modes=float32,int8`` and ``select=acc_drop<=1`` to the pipeline's own specs.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfopt import config as config_lib
from tfopt.config import RunConfig
from tfopt.core.errors import ConfigError

RUN_SECTIONS = ("data", "model", "runtime", "train")
MULTI_PROCESS = ("multi_worker_mirrored", "parameter_server")


@dataclass(frozen=True)
class TeacherSpec:
    """The teacher, trained from scratch or fine-tuned (``tfopt.train``): any model source."""

    # a built-in name, a model file, keras.applications:NAME, package.module:function
    model: str = config_lib.ModelConfig.name
    args: str = ""  # KEY=VALUE,... of keras.applications:NAME or a factory
    epochs: int = config_lib.TrainConfig.epochs  # tfopt.train's defaults
    learning_rate: float = config_lib.TrainConfig.learning_rate


@dataclass(frozen=True)
class StudentSpec:
    """The student, distilled from the teacher (``tfopt.distill``): any model source."""

    model: str = "tiny_cnn"
    args: str = ""
    epochs: int = config_lib.TrainConfig.epochs
    learning_rate: float = config_lib.TrainConfig.learning_rate
    temperature: float = (
        config_lib.DistillConfig.temperature
    )  # the loss's defaults are tfopt.distill's
    alpha: float = config_lib.DistillConfig.alpha


@dataclass(frozen=True)
class CompressSpec:
    """How the student is compressed (``tfopt.optimize``): one output per technique.

    These override the ``optimize`` section of the config tree (:class:`tfopt.config.OptimizeConfig`)
    for each technique; a pipeline prunes less (0.5) and fine-tunes one epoch per phase.
    """

    techniques: tuple[str, ...] = ("pqat",)
    sparsity: float = 0.5
    # low_rank, channel_prune: the result's multiply-adds as a share of the student's
    flops: float = config_lib.OptimizeConfig.channels_flops
    epochs: int = 1  # fine-tuning epochs per phase
    learning_rate: float = config_lib.OptimizeConfig.learning_rate


@dataclass(frozen=True)
class ExportSpec:
    """What every model is exported to and how it is measured (``tfopt.export``): overrides of
    the ``export`` section of the config tree (:class:`tfopt.config.ExportConfig`). A pipeline
    leaves int8_auto out of its modes (its search multiplies the export's time)."""

    modes: tuple[str, ...] = ("float32", "dynamic_auto", "float16", "int8", "int16x8")
    eval_limit: int = config_lib.ExportConfig.eval_limit  # test examples scored (0 = all)
    runs: int = config_lib.ExportConfig.runs  # timed invocations per latency figure
    warmup: int = config_lib.ExportConfig.warmup
    threads: tuple[int, ...] = (1, 2)
    calibration_steps: int = config_lib.ExportConfig.calibration_steps

    def overrides(self, qat: bool = False) -> dict:
        """The ``export`` config keys this spec sets (a QAT model converts to int8 only)."""
        return {
            "modes": "int8" if qat else ",".join(self.modes),
            "eval_limit": self.eval_limit,
            "runs": self.runs,
            "warmup": self.warmup,
            "threads": ",".join(map(str, self.threads)),
            "calibration_steps": self.calibration_steps,
        }


@dataclass(frozen=True)
class ProbeSpec:
    """The input-pipeline probe after training (:mod:`tfopt.pipeline.probe`)."""

    steps: int = 32  # timed steps per measurement (0 = skip the probe)


#: launch.isolate: tfopt.launch's default, --isolate, --no-isolate.
ISOLATE_CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class LaunchSpec:
    """Processes of a multi-process strategy (started by ``tfopt.launch`` for each training stage)."""

    workers: int = 2
    ps: int = 1  # parameter servers (parameter_server only; it also gets a chief)
    max_restarts: int = 2
    isolate: str = (
        "auto"  # a private network namespace per launch: auto (where possible), on (or fail), off
    )


@dataclass(frozen=True)
class PipelineConfig:
    """One pipeline: its name, the shared RunConfig and each stage's spec.

    Attributes:
        name: The pipeline's name (the default run directory is ``runs/<name>``).
        base: Data, runtime and train settings every training stage starts from.
        teacher, student, compress, export, probe, launch: The stages' specs.
        select: The rule that picks the edge model, e.g. ``acc_drop<=0.5,p50_us<=50``.
    """

    name: str
    base: RunConfig = field(default_factory=RunConfig)
    teacher: TeacherSpec = field(default_factory=TeacherSpec)
    student: StudentSpec = field(default_factory=StudentSpec)
    compress: CompressSpec = field(default_factory=CompressSpec)
    export: ExportSpec = field(default_factory=ExportSpec)
    probe: ProbeSpec = field(default_factory=ProbeSpec)
    launch: LaunchSpec = field(default_factory=LaunchSpec)
    select: str = "acc_drop<=0.5"

    def to_dict(self) -> dict:
        """The config as nested plain data (JSON-ready)."""
        return dataclasses.asdict(self)

    def validate(self) -> PipelineConfig:
        """Checks every spec; returns self.

        Raises:
            ConfigError: a bad value (the message names it and the fix).
        """
        from tfopt.compress.techniques import TECHNIQUES
        from tfopt.models.sources import check as check_model

        if not self.name or os.sep in self.name:
            raise ConfigError(
                f"pipeline name {self.name!r} must be a non-empty word (it names the run directory)"
            )
        for what, spec in (("teacher", self.teacher), ("student", self.student)):
            check_model(config_lib.ModelConfig(name=spec.model, args=spec.args))
            if spec.epochs < 1 or spec.learning_rate <= 0:
                raise ConfigError(
                    f"{what}.epochs={spec.epochs} must be >= 1 and {what}.learning_rate="
                    f"{spec.learning_rate} > 0"
                )
        if not self.student.temperature > 0 or not 0 <= self.student.alpha <= 1:
            raise ConfigError(
                f"student.temperature={self.student.temperature} must be > 0 and student.alpha="
                f"{self.student.alpha} in [0, 1]"
            )
        bad = [t for t in self.compress.techniques if t not in TECHNIQUES]
        if bad or len(set(self.compress.techniques)) != len(self.compress.techniques):
            raise ConfigError(
                f"compress.techniques={','.join(self.compress.techniques)!r} is not valid; give distinct "
                f"names from {', '.join(TECHNIQUES)} (or nothing to skip compression)"
            )
        if (
            not 0 <= self.compress.sparsity < 1
            or self.compress.epochs < 1
            or self.compress.learning_rate <= 0
        ):
            raise ConfigError(
                f"compress.sparsity={self.compress.sparsity} must be in [0, 1), compress.epochs="
                f"{self.compress.epochs} >= 1 and compress.learning_rate > 0"
            )
        if not 0 < self.compress.flops <= 1:
            raise ConfigError(
                f"compress.flops={self.compress.flops} must be in (0, 1], e.g. 0.5 for half the "
                "student's multiply-adds"
            )
        config_lib.from_dict({"export": self.export.overrides()})
        if self.probe.steps < 0:
            raise ConfigError(f"probe.steps={self.probe.steps} must be >= 0 (0 skips the probe)")
        if self.launch.workers < 1 or self.launch.ps < 1 or self.launch.max_restarts < 0:
            raise ConfigError(
                f"launch.workers={self.launch.workers} and launch.ps={self.launch.ps} must be >= 1, "
                f"launch.max_restarts={self.launch.max_restarts} >= 0"
            )
        if self.launch.isolate not in ISOLATE_CHOICES:
            raise ConfigError(
                f"launch.isolate={self.launch.isolate!r} is not valid; choose one of "
                f"{', '.join(ISOLATE_CHOICES)}"
            )
        from tfopt.report.select import parse_rule

        parse_rule(self.select)
        return self


_SPECS = {
    f.name: f
    for f in dataclasses.fields(PipelineConfig)
    if f.name not in ("name", "base", "select")
}


def _coerce(where: str, value: Any, typ: Any) -> Any:
    if typing.get_origin(typ) is tuple:
        item = typing.get_args(typ)[0]
        parts = (
            value
            if isinstance(value, (list, tuple))
            else [p for p in str(value).split(",") if p.strip()]
        )
        return tuple(_coerce(where, p.strip() if isinstance(p, str) else p, item) for p in parts)
    section, _, key = where.partition(".")
    return config_lib.coerce(section, key, value, typ)  # the one coercion rule of all configs


def _replace_spec(spec: Any, section: str, values: Mapping[str, Any]) -> Any:
    types = typing.get_type_hints(type(spec))
    updates = {}
    for key, value in values.items():
        if key not in types:
            raise ConfigError(
                f"unknown key {section}.{key}; valid keys in {section!r}: {', '.join(types)}"
            )
        updates[key] = _coerce(f"{section}.{key}", value, types[key])
    return dataclasses.replace(spec, **updates)


def from_dict(raw: Mapping[str, Any], base: PipelineConfig | None = None) -> PipelineConfig:
    """Builds a validated PipelineConfig from nested plain data (any subset of its sections).

    Args:
        raw: ``{"name": ..., "base": {"data": {...}, ...}, "teacher": {...}, ..., "select": "..."}``;
            the RunConfig sections (``data``, ``runtime``, ...) may also stand at the top level.
        base: Values not in ``raw`` come from here.

    Raises:
        ConfigError: an unknown section or key, or a bad value.
    """
    cfg = base or PipelineConfig(name=str(raw.get("name", "")))
    run_raw = dict(raw.get("base") or {})
    for section in RUN_SECTIONS:
        if section in raw:
            run_raw.setdefault(section, {}).update(raw[section] or {})
    updates: dict[str, Any] = {"base": config_lib.from_dict(run_raw, cfg.base)}
    valid = ("name", "base", "select", *RUN_SECTIONS, *_SPECS)
    for key, value in raw.items():
        if key not in valid:
            raise ConfigError(
                f"unknown pipeline section {key!r}; valid sections: {', '.join(valid)}"
            )
        if key in _SPECS:
            if not isinstance(value, Mapping):
                raise ConfigError(
                    f"pipeline section {key!r} must be a mapping of keys, got {value!r}"
                )
            updates[key] = _replace_spec(getattr(cfg, key), key, value)
        elif key in ("name", "select"):
            updates[key] = str(value)
    return dataclasses.replace(cfg, **updates).validate()


def apply_overrides(cfg: PipelineConfig, overrides: list[str]) -> PipelineConfig:
    """Applies ``--set`` overrides: ``section.key=value`` (RunConfig or pipeline section) or ``select=RULE``.

    Raises:
        ConfigError: a malformed override, unknown key or bad value.
    """
    raw: dict[str, Any] = {}
    for item in overrides:
        name, sep, value = item.partition("=")
        name = name.strip()
        if name == "select" and sep:
            raw["select"] = value.strip()
            continue
        section, dot, key = name.partition(".")
        if not sep or not dot or not key:
            raise ConfigError(
                f"override {item!r} is not of the form section.key=value (e.g. teacher.epochs=1 "
                "or data.limit=2048) or select=RULE"
            )
        raw.setdefault(section, {})[key] = value.strip()
    out = from_dict(raw, cfg)
    _refuse_unused_compress(set(raw.get("compress", {})), out.compress.techniques)
    return out


def _refuse_unused_compress(given: set[str], techniques: tuple[str, ...]) -> None:
    """Refuses ``--set compress.sparsity``/``compress.flops`` that no chosen technique reads."""
    from tfopt.compress.techniques import STRUCTURAL, TECHNIQUES

    readers = {
        "sparsity": [n for n, t in TECHNIQUES.items() if "prune" in t.phases and not t.m_by_n],
        "flops": [n for n, t in TECHNIQUES.items() if set(STRUCTURAL) & set(t.phases)],
    }
    for key, users in readers.items():
        if key in given and not set(users) & set(techniques):
            raise ConfigError(
                f"compress.{key} is not used by compress.techniques={','.join(techniques)!r} (it "
                f"belongs to {', '.join(users)}); add one of them to compress.techniques, or drop "
                f"compress.{key}"
            )


def example_dirs() -> list[str]:
    """Where the example pipelines live: the installed copy (``<prefix>/share/tfopt/pipelines``,
    from the wheel's data files), then a source checkout's ``pipelines/``."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    dirs = [
        os.path.join(sys.prefix, "share", "tfopt", "pipelines"),
        os.path.join(here, "pipelines"),
    ]
    return [d for d in dirs if os.path.isdir(d)]


def example_names() -> list[str]:
    """The names of the example pipelines tfopt ships (``mnist_edge``, ...)."""
    return sorted(
        {f[:-3] for d in example_dirs() for f in os.listdir(d) if f.endswith(".py") and f[0] != "_"}
    )


def find_pipeline(path_or_name: str) -> str:
    """The pipeline file ``path_or_name`` names: a ``.py`` path, or the name of an example.

    Raises:
        ConfigError: no such file, not a ``.py`` file, or no example of that name.
    """
    if path_or_name.endswith(".py") or os.sep in path_or_name or "/" in path_or_name:
        if not path_or_name.endswith(".py"):
            raise ConfigError(
                f"pipeline {path_or_name!r} is not a .py file; give e.g. pipelines/mnist_edge.py"
            )
        if not os.path.isfile(path_or_name):
            raise ConfigError(
                f"pipeline {path_or_name!r}: no such file; give a path to a .py file or one of "
                f"the examples by name: {', '.join(example_names())}"
            )
        return path_or_name
    for d in example_dirs():
        candidate = os.path.join(d, path_or_name + ".py")
        if os.path.isfile(candidate):
            return candidate
    names = example_names()
    close = difflib.get_close_matches(path_or_name, names, n=1)
    hint = f"; did you mean {close[0]}" if close else ""
    raise ConfigError(
        f"no example pipeline named {path_or_name!r}{hint}; choose one of {', '.join(names)} "
        "or give a path to a .py file"
    )


def load_pipeline(path: str, variant: str = "default") -> PipelineConfig:
    """Imports a pipeline file (a path, or an example's name) and returns its validated
    ``get_config(variant)``.

    Raises:
        ConfigError: the file is missing or lacks ``get_config``, or the variant is unknown.
    """
    path = find_pipeline(path)
    spec = importlib.util.spec_from_file_location(
        f"tfopt_pipeline_{os.path.basename(path)[:-3]}", path
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "get_config", None)):
        raise ConfigError(
            f"pipeline {path!r} defines no get_config(variant); see pipelines/README.md"
        )
    variants = tuple(getattr(module, "VARIANTS", ("default",)))
    if variant not in variants:
        raise ConfigError(
            f"--variant {variant!r} is not one of {path}'s variants: {', '.join(variants)}"
        )
    cfg = module.get_config(variant)
    if not isinstance(cfg, PipelineConfig):
        raise ConfigError(
            f"{path}: get_config({variant!r}) returned {type(cfg).__name__}, not a PipelineConfig"
        )
    return cfg.validate()
