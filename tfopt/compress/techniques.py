"""The technique registry and what tfopt does with each strategy and precision policy.

A technique is a list of phases, each one fine-tuning run with one kind of tfmot wrapper, or a
structural edit of the model (:mod:`tfopt.compress.surgery`) followed by plain fine-tuning:

    prune       prune                       (magnitude, schedule)
    prune_2of4  prune                       (2 zeros in every 4 weights)
    qat         qat                         (default 8-bit scheme)
    cluster     cluster
    pqat        prune -> qat                (prune-preserving QAT)
    cqat        cluster -> qat              (cluster-preserving QAT)
    pcqat       prune -> cluster -> qat     (clustering keeps the zeros; sparsity-and-cluster-preserving QAT)
    low_rank    low_rank                    (truncated SVD of Dense/Conv2D kernels into two layers, fine-tuned)
    low_rank_qat low_rank -> qat            (the factorized model, then QAT)
    channel_prune channel_prune             (whole channels removed: a smaller dense model, fine-tuned)
    channel_prune_qat channel_prune -> qat  (the narrower model, then QAT)

Every technique runs under every strategy and precision policy; where tfmot alone fails, tfopt
works around it (``MIXED_NOTES``). The test matrix records what really happens for every cell into
``docs/compatibility.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfopt.core.errors import OptimizeError


@dataclass(frozen=True)
class Technique:
    """A named sequence of phases and the QAT scheme its last phase uses."""

    name: str
    phases: tuple[str, ...]
    qat_scheme: str = "default"
    m_by_n: tuple[int, int] | None = None
    description: str = ""


TECHNIQUES: dict[str, Technique] = {
    t.name: t
    for t in (
        Technique("prune", ("prune",), description="magnitude pruning to --sparsity"),
        Technique(
            "prune_2of4",
            ("prune",),
            m_by_n=(2, 4),
            description="structured pruning: 2 zeros in every 4 weights",
        ),
        Technique("qat", ("qat",), description="quantization-aware training, default 8-bit scheme"),
        Technique(
            "cluster", ("cluster",), description="weight clustering to --clusters values per kernel"
        ),
        Technique(
            "pqat",
            ("prune", "qat"),
            qat_scheme="prune_preserve",
            description="prune, then prune-preserving QAT",
        ),
        Technique(
            "cqat",
            ("cluster", "qat"),
            qat_scheme="cluster_preserve",
            description="cluster, then cluster-preserving QAT",
        ),
        Technique(
            "pcqat",
            ("prune", "cluster", "qat"),
            qat_scheme="sparsity_cluster_preserve",
            description="prune, sparsity-preserving clustering, then sparsity-and-cluster-preserving QAT",
        ),
        Technique(
            "low_rank",
            ("low_rank",),
            description="truncated SVD of Dense/Conv2D kernels into two smaller layers, to --low-rank-flops",
        ),
        Technique(
            "low_rank_qat", ("low_rank", "qat"), description="low-rank factorization, then QAT"
        ),
        Technique(
            "channel_prune",
            ("channel_prune",),
            description="structured pruning of whole channels into a smaller dense model, to --channels-flops",
        ),
        Technique(
            "channel_prune_qat", ("channel_prune", "qat"), description="channel pruning, then QAT"
        ),
    )
}

#: Phase kinds that change the model's structure (a plain model comes out; no wrapper to strip).
STRUCTURAL = ("low_rank", "channel_prune")
#: Every phase kind, in the order a chain may hold them.
PHASE_KINDS = ("channel_prune", "low_rank", "prune", "cluster", "qat")

#: Techniques another stage can train a model under in one phase, with its own loss ("none" = plain).
ONE_PHASE = ("none",) + tuple(
    name
    for name, t in TECHNIQUES.items()
    if len(t.phases) == 1 and t.m_by_n is None and t.phases[0] not in STRUCTURAL
)

# What tfopt does under a mixed policy, per phase kind (recorded in run.json and the matrix).
MIXED_NOTES = {
    "prune": "pruned layers compute in float32 (tfmot's mask update breaks on mixed dtypes, "
    "model-optimization#409); the others in the mixed dtype",
    "cluster": "clustered layers compute in float32 (tfmot's centroid init rejects bfloat16/float16); "
    "the others in the mixed dtype",
    "qat": "quantized layers compute in float32 (fake-quant kernels are float32-only, model-optimization#367); "
    "layers left unquantized keep the mixed dtype",
    "low_rank": "the factorized model computes in the mixed dtype, its output layer in float32, like any model",
    "channel_prune": "the narrower model computes in the mixed dtype, its output layer in float32, like any model",
}


def get(name: str) -> Technique:
    """The technique called ``name``.

    Raises:
        OptimizeError: unknown name (the message lists the valid ones).
    """
    if name not in TECHNIQUES:
        raise OptimizeError(
            f"technique {name!r} is not valid; choose one of {', '.join(TECHNIQUES)}"
        )
    return TECHNIQUES[name]


def mixed_notes(technique: str, precision: str) -> list[str]:
    """What tfopt changes for a mixed policy, one note per phase kind of ``technique``."""
    if precision == "float32":
        return []
    return [f"{phase}: {MIXED_NOTES[phase]}" for phase in dict.fromkeys(get(technique).phases)]
