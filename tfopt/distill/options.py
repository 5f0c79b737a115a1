"""What to distil from, and how: plain data, validated before TensorFlow starts."""

from __future__ import annotations

import dataclasses

from tfopt.compress.techniques import ONE_PHASE
from tfopt.config import COMBINE_MODES, DistillConfig
from tfopt.core.errors import ConfigError

_LOSS = DistillConfig()


@dataclasses.dataclass(frozen=True)
class DistillOptions:
    """The distillation settings (data, runtime and train settings live in the RunConfig).

    Attributes:
        teachers: Run directories of trained teachers, or model files (trained on the same data).
        temperature: Softmax temperature T.
        alpha: Weight of the teacher term in [0, 1].
        teacher_weights: ``equal``, ``accuracy`` or comma-separated numbers (one per teacher).
        combine: ``probs`` or ``logits``.
        features: ``(teacher_layer, student_layer, teacher_index)`` pairs for feature distillation.
        feature_weight: Weight of the feature term.
        technique: Compress while distilling: one of ``tfopt.compress.techniques.ONE_PHASE``.
        sparsity: Target sparsity for ``prune``.
        clusters: Centroids per kernel for ``cluster``.
        baseline: Run directory of the same student trained without a teacher (gap closed).
        trust_model: Load teacher files that can run code.
    """

    teachers: tuple[str, ...]
    temperature: float = _LOSS.temperature  # every loss default lives in tfopt.config.DistillConfig
    alpha: float = _LOSS.alpha
    teacher_weights: str = _LOSS.teacher_weights
    combine: str = _LOSS.combine
    features: tuple[tuple[str, str, int], ...] = ()
    feature_weight: float = _LOSS.feature_weight
    technique: str = "none"
    sparsity: float = 0.75
    clusters: int = 16
    baseline: str | None = None
    trust_model: bool = False

    def fixed_weights(self) -> list[float] | None:
        """Validates every option; returns the fixed teacher weights, if given.

        Raises:
            ConfigError: a bad option (the message names the value and the fix).
        """
        if not self.teachers:
            raise ConfigError(
                "no --teacher given; give the run directory of a trained model (repeatable)"
            )
        if not self.temperature > 0:
            raise ConfigError(
                f"--temperature {self.temperature} must be > 0 (Hinton et al. use 2-20)"
            )
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(
                f"--alpha {self.alpha} must be in [0, 1] (0 = labels only, 1 = teacher only)"
            )
        if self.combine not in COMBINE_MODES:
            raise ConfigError(
                f"--combine {self.combine!r} is not valid; choose one of {', '.join(COMBINE_MODES)}"
            )
        if self.technique not in ONE_PHASE:
            raise ConfigError(
                f"--technique {self.technique!r} is not valid; choose one of {', '.join(ONE_PHASE)}"
            )
        if self.technique == "prune" and not 0.0 < self.sparsity < 1.0:
            raise ConfigError(f"--sparsity {self.sparsity} must be in (0, 1), e.g. 0.75")
        if self.technique == "cluster" and not 2 <= self.clusters <= 256:
            raise ConfigError(f"--clusters {self.clusters} must be in [2, 256], e.g. 16")
        for _, _, index in self.features:
            if index >= len(self.teachers):
                raise ConfigError(
                    f"--feature names teacher {index}; there are {len(self.teachers)} (0-based)"
                )
        if self.teacher_weights in ("equal", "accuracy"):
            return None
        try:
            weights = [float(w) for w in self.teacher_weights.split(",")]
        except ValueError:
            weights = []
        if len(weights) != len(self.teachers) or min(weights) < 0 or not sum(weights) > 0:
            raise ConfigError(
                f"--teacher-weights {self.teacher_weights!r} must be equal, accuracy or "
                f"{len(self.teachers)} comma-separated non-negative numbers (one per --teacher)"
            )
        return weights

    def to_dict(self) -> dict:
        """The options as JSON-ready data (what run.json and the resume fingerprint record)."""
        out = dataclasses.asdict(self)
        out["features"] = [
            {"teacher_layer": t, "student_layer": s, "teacher": i} for t, s, i in self.features
        ]
        out.pop("trust_model")
        return out


def parse_feature(text: str) -> tuple[str, str, int]:
    """Parses ``[TEACHER_INDEX/]TEACHER_LAYER:STUDENT_LAYER`` (e.g. ``pool0:stem_relu``, ``1/fc:flatten``)."""
    index, sep, rest = text.partition("/")
    if not sep:
        index, rest = "0", text
    teacher_layer, colon, student_layer = rest.partition(":")
    if not colon or not teacher_layer or not student_layer or not index.isdigit():
        raise ConfigError(
            f"--feature {text!r} is not [TEACHER_INDEX/]TEACHER_LAYER:STUDENT_LAYER; "
            "e.g. --feature pool0:stem_relu"
        )
    return teacher_layer, student_layer, int(index)
