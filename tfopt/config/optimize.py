"""The ``optimize`` section: how ``tfopt.optimize`` compresses a trained model."""

from __future__ import annotations

from dataclasses import dataclass

from tfopt.config.fields import flag
from tfopt.core.errors import ConfigError

#: optimize.schedule: how the pruned share grows (tfmot's PolynomialDecay or ConstantSparsity).
SCHEDULES = ("polynomial", "constant")
#: optimize.low_rank_by: what chooses each layer's rank.
LOW_RANK_BY = ("flops", "energy")
#: optimize.low_rank_conv: how a k x k Conv2D is factorized.
LOW_RANK_CONV = ("pointwise", "spatial")
#: optimize.importance: how channel pruning ranks channels.
IMPORTANCES = ("l1", "l2", "bn", "taylor")
#: optimize.ranking: channels ranked model-wide or per group.
RANKINGS = ("global", "uniform")
#: optimize.policy: tfmot's pruning policy.
PRUNE_POLICIES = ("none", "xnnpack")
#: optimize.centroid_init: how clustering places its first centroids.
CENTROID_INITS = ("kmeans_plus_plus", "density", "linear", "random")
#: optimize.epochs=0: the phase kinds that fine-tune this long (structural changes need time to
#: recover, as tfmot's guides fine-tune for a few epochs); the others fine-tune 1 epoch.
LONG_PHASES = {"prune": 3, "low_rank": 3, "channel_prune": 3}


def _tech(default, name: str, help: str, reads: str, group: str, **kw):
    """An optimize field read by the techniques with phase ``reads`` (``magnitude``: a pruning
    phase on a sparsity schedule, as tfopt.optimize.cli spells out over the registry)."""
    return flag(default, name, help, group=group, read_by=(reads,), **kw)


@dataclass(frozen=True)
class OptimizeConfig:
    """How ``tfopt.optimize`` compresses a trained model: the one home of every default.

    A field's :attr:`Flag.read_by` names the phase that reads it (``magnitude``: a pruning phase
    on a sparsity schedule, which ``prune_2of4`` has not); the techniques whose phases include it
    own its option, and any other technique refuses it.
    """

    technique: str = flag(
        "", "--technique", "one technique, or several separated by commas (run in one job)"
    )
    layers: str = flag(
        "", "--layers", "comma-separated layer names to optimize (default: every supported layer)"
    )
    layer_types: str = flag(
        "", "--layer-types", "comma-separated layer classes to optimize, e.g. Conv2D,Dense"
    )
    sparsity: float = _tech(
        0.8, "--sparsity", "target share of zero weights", "magnitude", "pruning"
    )
    schedule: str = _tech(
        "polynomial",
        "--schedule",
        "polynomial (PolynomialDecay from --initial-sparsity) or constant (ConstantSparsity)",
        "magnitude",
        "pruning",
        choices=SCHEDULES,
    )
    initial_sparsity: float = _tech(
        0.0, "--initial-sparsity", "polynomial schedule start", "magnitude", "pruning"
    )
    begin_step: int = _tech(0, "--begin-step", "the step pruning starts at", "magnitude", "pruning")
    end_step: int = _tech(
        -1,
        "--end-step",
        "-1 (the default) = end of the phase (constant) / two thirds into it (polynomial)",
        "magnitude",
        "pruning",
    )
    frequency: int = _tech(
        0,
        "--frequency",
        "mask update every N steps (0, the default: ~20 per phase, at most every 100)",
        "magnitude",
        "pruning",
    )
    block_size: str = _tech(
        "1,1",
        "--block-size",
        "block sparsity of Dense kernels [in, out], e.g. 4,1 (runs of 4 inputs: contiguous in "
        "TFLite, smaller gzip); convolutions stay unstructured (1,1 = unstructured)",
        "magnitude",
        "pruning",
        metavar="ROWS,COLS",
    )
    policy: str = _tech(
        "none",
        "--policy",
        "none or xnnpack (PruneForLatencyOnXNNPack)",
        "prune",
        "pruning",
        choices=PRUNE_POLICIES,
    )
    clusters: int = _tech(16, "--clusters", "centroids per kernel", "cluster", "clustering")
    centroid_init: str = _tech(
        "kmeans_plus_plus",
        "--centroid-init",
        "where the centroids start",
        "cluster",
        "clustering",
        choices=CENTROID_INITS,
    )
    per_channel: bool = _tech(
        False,
        "--per-channel",
        "one set of centroids per Conv2D output channel",
        "cluster",
        "clustering",
    )
    low_rank_by: str = _tech(
        "flops",
        "--low-rank-by",
        "choose each layer's rank by a FLOPs budget for the model or by the energy each kernel "
        "keeps",
        "low_rank",
        "low-rank factorization",
        choices=LOW_RANK_BY,
    )
    low_rank_flops: float = _tech(
        0.5,
        "--low-rank-flops",
        "target multiply-adds as a share of the model's",
        "low_rank",
        "low-rank factorization",
    )
    low_rank_energy: float = _tech(
        0.9,
        "--low-rank-energy",
        "share of each kernel's squared singular values kept",
        "low_rank",
        "low-rank factorization",
    )
    low_rank_round_to: int = _tech(
        1,
        "--low-rank-round-to",
        "ranks are multiples of N, e.g. 8",
        "low_rank",
        "low-rank factorization",
    )
    low_rank_conv: str = _tech(
        "pointwise",
        "--low-rank-conv",
        "a k x k Conv2D becomes k x k then 1 x 1 (pointwise) or k x 1 then 1 x k (spatial)",
        "low_rank",
        "low-rank factorization",
        choices=LOW_RANK_CONV,
    )
    channels_flops: float = _tech(
        0.5,
        "--channels-flops",
        "target multiply-adds as a share of the model's",
        "channel_prune",
        "channel pruning",
    )
    channels_ratio: float = _tech(
        0.0,
        "--channels-ratio",
        "remove this share of the prunable channels instead of aiming at --channels-flops",
        "channel_prune",
        "channel pruning",
    )
    target_latency_us: float = _tech(
        0.0,
        "--target-latency-us",
        "aim at this LiteRT p50 (microseconds, batch 1, float .tflite) instead of "
        "--channels-flops, predicted from a table of timed layer widths (0, the default: off)",
        "channel_prune",
        "channel pruning",
        metavar="US",
    )
    latency_threads: int = _tech(
        1,
        "--latency-threads",
        "interpreter threads --target-latency-us is measured with",
        "channel_prune",
        "channel pruning",
    )
    importance: str = _tech(
        "l1",
        "--importance",
        "channel importance: kernel L1 or L2 norm, the following batch norm's |gamma|, or "
        "first-order Taylor on --taylor-batches training batches",
        "channel_prune",
        "channel pruning",
        choices=IMPORTANCES,
    )
    taylor_batches: int = _tech(
        8,
        "--taylor-batches",
        "batches taylor importance averages",
        "channel_prune",
        "channel pruning",
    )
    ranking: str = _tech(
        "global",
        "--ranking",
        "rank channels model-wide or remove the same share of every group",
        "channel_prune",
        "channel pruning",
        choices=RANKINGS,
    )
    round_to: int = _tech(
        1,
        "--round-to",
        "round widths up to a multiple of N, e.g. 8",
        "channel_prune",
        "channel pruning",
    )
    prune_iterations: int = _tech(
        1,
        "--prune-iterations",
        "reach the target in N prune + fine-tune steps, each fine-tuning --epochs",
        "channel_prune",
        "channel pruning",
    )
    epochs: int = flag(
        0,
        "--epochs",
        "epochs of every phase (0, the default: 3 for pruning, low-rank and channel pruning, 1 "
        "for QAT and clustering)",
        group="fine-tuning",
    )
    phase_epochs: str = flag(
        "",
        "--phase-epochs",
        "epochs of some phase kinds, e.g. prune=3,qat=1 (overrides --epochs for them)",
        group="fine-tuning",
        metavar="KIND=N[,...]",
    )
    steps_per_epoch: int = flag(
        0,
        "--steps-per-epoch",
        "0 (the default) = one pass over the training split",
        group="fine-tuning",
    )
    learning_rate: float = flag(
        5e-4,
        "--lr",
        "fine-tuning learning rate (cosine-decayed over each phase when the input run's "
        "train.lr_schedule is cosine, the default)",
        group="fine-tuning",
    )
    tensorboard: bool = flag(
        True, "--no-tensorboard", "no TensorBoard (pruning summaries) logs", group="output"
    )
    saved_model: bool = flag(
        True, "--no-saved-model", "write model.keras only (faster)", group="output"
    )

    def techniques(self) -> tuple[str, ...]:
        """The technique names ``technique`` lists (comma-separated)."""
        return tuple(t.strip() for t in self.technique.split(",") if t.strip())

    def phase_epochs_of(self) -> tuple[tuple[str, int], ...]:
        """``phase_epochs`` as ``((kind, epochs), ...)``, with :data:`LONG_PHASES` where
        ``epochs`` is 0 and ``phase_epochs`` does not name the kind.

        Raises:
            ConfigError: an item that is not ``KIND=N``.
        """
        out = []
        for item in (x.strip() for x in self.phase_epochs.split(",") if x.strip()):
            kind, sep, value = item.partition("=")
            if not sep or not value.strip().isdigit():
                raise ConfigError(
                    f"optimize.phase_epochs item {item!r} is not KIND=N; e.g. prune=3,qat=1"
                )
            out.append((kind.strip(), int(value)))
        if not self.epochs:
            out += [(k, n) for k, n in LONG_PHASES.items() if k not in dict(out)]
        return tuple(out)

    def block(self) -> tuple[int, int]:
        """``block_size`` as ``(rows, cols)``.

        Raises:
            ConfigError: not ``ROWS,COLS``.
        """
        parts = [p.strip() for p in self.block_size.replace("x", ",").split(",") if p.strip()]
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ConfigError(
                f"optimize.block_size={self.block_size!r} is not ROWS,COLS; e.g. --block-size 4,1"
            )
        return int(parts[0]), int(parts[1])
