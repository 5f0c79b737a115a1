"""The ``distill`` section: how ``tfopt.distill`` distils teachers into a student."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from tfopt.config.fields import flag
from tfopt.core.errors import ConfigError

#: distill.combine: how several teachers' outputs are combined (see tfopt.models.distiller).
COMBINE_MODES = ("probs", "logits")
#: distill.technique: compress while distilling, in one phase under the distillation loss ("none" =
#: plain). tfopt.compress.techniques derives the same list from its registry (a test holds them equal).
DISTILL_TECHNIQUES = ("none", "prune", "qat", "cluster")


@dataclass(frozen=True)
class DistillConfig:
    """How ``tfopt.distill`` distils teachers into a student: the one home of every default.

    The :class:`~tfopt.models.distiller.Distiller` model and pipelines' student stage default to
    these too. Temperature and alpha were chosen on the validation split by
    ``bench/distill_defaults.py`` (``bench/results/distill_defaults.json``).
    """

    #: The field whose value decides which of the others are read (:attr:`Flag.read_by`).
    CHOSEN_BY: typing.ClassVar[str] = "technique"

    temperature: float = flag(1.0, "--temperature", "softmax temperature T, chosen on validation")
    alpha: float = flag(
        0.5,
        "--alpha",
        "weight of the teacher term in [0, 1] (0 = labels only, 1 = teacher only), chosen on "
        "validation",
    )
    teacher_weights: str = flag(
        "equal",
        "--teacher-weights",
        "equal, accuracy (from validation accuracy) or W1,W2,... (one per --teacher)",
    )
    combine: str = flag("probs", "--combine", "combine several teachers' probs or logits")
    features: str = flag(
        "",
        "--feature",
        "feature distillation between two named layers (repeatable)",
        metavar="[I/]TEACHER_LAYER:STUDENT_LAYER",
        repeat=True,
    )
    feature_weight: float = flag(1.0, "--feature-weight", "weight of the feature term")
    technique: str = flag("none", "--technique", "compress while distilling")
    sparsity: float = flag(
        0.75, "--sparsity", "target sparsity of --technique prune", read_by=("prune",)
    )
    clusters: int = flag(
        16, "--clusters", "centroids per kernel of --technique cluster", read_by=("cluster",)
    )
    baseline: str = flag(
        "",
        "--baseline",
        "run of the same student trained without a teacher (the report gives the gap closed)",
        metavar="RUN",
    )


def parse_features(text: str) -> tuple[tuple[str, str, int], ...]:
    """Parses ``distill.features``: comma-separated ``[TEACHER_INDEX/]TEACHER_LAYER:STUDENT_LAYER``.

    Raises:
        ConfigError: an entry of another form (one line naming it and an example).
    """
    out = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        index, sep, rest = entry.partition("/")
        if not sep:
            index, rest = "0", entry
        teacher_layer, colon, student_layer = rest.partition(":")
        if not colon or not teacher_layer or not student_layer or not index.isdigit():
            raise ConfigError(
                f"--feature {entry!r} is not [TEACHER_INDEX/]TEACHER_LAYER:STUDENT_LAYER; "
                "e.g. --feature pool0:stem_relu"
            )
        out.append((teacher_layer, student_layer, int(index)))
    return tuple(out)
