"""What to distil from: the teachers checked against the ``distill`` config section, before
TensorFlow starts. Every distillation setting is a field of :class:`tfopt.config.DistillConfig`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence

from tfopt import config as config_lib
from tfopt.config import DistillConfig, RunConfig, parse_features
from tfopt.core.errors import ConfigError


def fixed_weights(d: DistillConfig, teachers: Sequence[str]) -> list[float] | None:
    """Checks ``d`` against the teachers; returns the fixed teacher weights, if given.

    Raises:
        ConfigError: no teacher, weights that are not one per teacher, a feature pair naming a
            teacher that is not there (the message names the value and the fix).
    """
    if not teachers:
        raise ConfigError(
            "no --teacher given; give the run directory of a trained model (repeatable)"
        )
    for _, _, index in parse_features(d.features):
        if index >= len(teachers):
            raise ConfigError(
                f"--feature names teacher {index}; there are {len(teachers)} (0-based)"
            )
    weights = config_lib.teacher_weights(d.teacher_weights)
    if weights is not None and len(weights) != len(teachers):
        raise ConfigError(
            f"--teacher-weights {d.teacher_weights!r} must be equal, accuracy or "
            f"{len(teachers)} comma-separated non-negative numbers (one per --teacher)"
        )
    return weights


def settings_record(d: DistillConfig, teachers: Sequence[str]) -> dict:
    """The settings as ``run.json``'s ``distill.settings`` records them."""
    out = {"teachers": list(teachers), **dataclasses.asdict(d)}
    out["features"] = [
        {"teacher_layer": t, "student_layer": s, "teacher": i}
        for t, s, i in parse_features(d.features)
    ]
    out["baseline"] = d.baseline or None
    return out


def parse_feature(text: str) -> tuple[str, str, int]:
    """Parses ``[TEACHER_INDEX/]TEACHER_LAYER:STUDENT_LAYER`` (e.g. ``pool0:stem_relu``, ``1/fc:flatten``)."""
    pairs = parse_features(text)
    if len(pairs) != 1:
        raise ConfigError(
            f"--feature {text!r} is not one [TEACHER_INDEX/]TEACHER_LAYER:STUDENT_LAYER; "
            "e.g. --feature pool0:stem_relu"
        )
    return pairs[0]


@dataclasses.dataclass(frozen=True)
class DistillOptions:
    """Deprecated: the teachers and the ``distill`` settings in one object.

    Give the settings as ``cfg.distill`` (:class:`tfopt.config.DistillConfig`, ``--set
    distill.KEY=VALUE``) and the teachers as :func:`tfopt.distill.run`'s ``teachers``. Kept
    for one release; :meth:`apply` turns it into those.
    """

    teachers: tuple[str, ...]
    temperature: float = DistillConfig.temperature
    alpha: float = DistillConfig.alpha
    teacher_weights: str = DistillConfig.teacher_weights
    combine: str = DistillConfig.combine
    features: tuple[tuple[str, str, int], ...] = ()
    feature_weight: float = DistillConfig.feature_weight
    technique: str = DistillConfig.technique
    sparsity: float = DistillConfig.sparsity
    clusters: int = DistillConfig.clusters
    baseline: str | None = None
    trust_model: bool = False

    def apply(self, cfg: RunConfig) -> tuple[RunConfig, tuple[str, ...]]:
        """``cfg`` with these settings in its ``distill`` section (and ``model.trust``), and the
        teachers."""
        warnings.warn(
            "DistillOptions is deprecated: set cfg.distill (tfopt.config.DistillConfig) and pass "
            "the teachers to tfopt.distill.run",
            DeprecationWarning,
            stacklevel=3,
        )
        section = dataclasses.asdict(self)
        del section["teachers"], section["trust_model"]
        section["features"] = ",".join(f"{i}/{t}:{s}" for t, s, i in self.features)
        section["baseline"] = self.baseline or ""
        raw = {"distill": section, "model": {"trust": cfg.model.trust or self.trust_model}}
        return config_lib.from_dict(raw, cfg), tuple(self.teachers)
