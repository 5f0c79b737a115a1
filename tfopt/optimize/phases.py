"""One fine-tuning phase (prune, cluster, QAT or a structural one) under a strategy and a precision policy.

Every phase follows the PITFALLS rule: rebuild the model inside ``strategy.scope()`` (fresh
variables, per-layer precision), wrap, compile, fit, then strip in that same scope. Its result
is a strategy-free float32 model (or a default-scheme QAT model), which the next phase, the
evaluation and the saving start from. Under MultiWorkerMirroredStrategy every worker runs every
line here: reading the weights is a collective.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass, field

from tfopt.core._keras import keras, tf

from tfopt.compress import channel_prune as channel_lib
from tfopt.compress import cluster as cluster_lib
from tfopt.compress import latency as latency_lib
from tfopt.compress import low_rank as low_rank_lib
from tfopt.compress import prune as prune_lib
from tfopt.compress import quantize as quantize_lib
from tfopt.compress.common import compute_dtypes, rebuild
from tfopt.compress.flops import model_macs
from tfopt.core._compat import tfmot_layer_dtype
from tfopt.runtime import sharding
from tfopt.runtime.job import Job
from tfopt.runtime.strategy import from_chief

log = logging.getLogger(__name__)


def _whole(ctx: Context, kind: str, names: list[str]) -> list[str]:
    """``names``, after the chief says once per phase that they stay whole under sharding."""
    if ctx.job.cfg.runtime.variable_partitioner != "none" and ctx.job.chief and names:
        log.info(
            f"{kind}: the {len(names)} layer(s) tfmot wraps keep their variables whole (tfmot's "
            "wrappers cannot hold a ShardedVariable); the other layers' are sharded",
            extra={"prog": "tfopt optimize"},
        )
    return names


@dataclass(frozen=True)
class FineTune:
    """How long and how fast each phase fine-tunes."""

    epochs: int
    steps_per_epoch: int
    learning_rate: float
    steps_per_execution: int

    @property
    def total_steps(self) -> int:
        """Steps of one phase."""
        return self.epochs * self.steps_per_epoch


@dataclass
class Context:
    """What the phases of one job share."""

    job: Job
    log_dir: str | None = None
    cache: dict = field(default_factory=dict)  # phase chain -> (result model, phase info)
    phases_run: int = 0


def _compile(model, ctx: Context, ft: FineTune) -> None:
    # The run's schedule over this phase; loss scaling under mixed_float16 (QAT models are built
    # float32 and may still hold float16 layers, so compile() would not add it).
    model.compile(
        optimizer=ctx.job.optimizer(ft.learning_rate, ft.total_steps),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=ft.steps_per_execution,
    )


class _NoUnusedKernelWarning(logging.Filter):
    """Drops Keras' "Gradients do not exist for variables" warning.

    A clustered layer computes with its centroids; the original kernel only seeds them and by
    design gets no gradient, which Keras reports at every trace.
    """

    def filter(self, record) -> bool:
        return not record.getMessage().startswith("Gradients do not exist for variables")


def _fit(ctx: Context, ft: FineTune, model, callbacks: list, kind: str) -> dict:
    started = time.perf_counter()
    clustered = kind == "cluster" or any(
        "Cluster" in type(layer).__name__ for layer in model.submodules
    )
    quiet = _NoUnusedKernelWarning()
    if clustered:
        tf.get_logger().addFilter(quiet)
    try:
        history = ctx.job.fit(
            model, callbacks, epochs=ft.epochs, steps_per_epoch=ft.steps_per_epoch
        )
    finally:
        tf.get_logger().removeFilter(quiet)
    last = {k: float(v[-1]) for k, v in history.history.items() if v}
    return {
        "phase": kind,
        "epochs": ft.epochs,
        "steps": ft.total_steps,
        "seconds": round(time.perf_counter() - started, 3),
        **{f"train_{k}": round(v, 5) for k, v in last.items()},
        "compute_dtypes": compute_dtypes(model),
    }


def _log_dir(ctx: Context, kind: str) -> str | None:
    if not ctx.log_dir:
        return None
    ctx.phases_run += 1
    return os.path.join(ctx.log_dir, f"{ctx.phases_run}-{kind}")


def _strip_phase(ctx: Context, ft: FineTune, src, kind: str, names: list[str], wrap, lib):
    # Rebuild in scope (wrapped layers in float32 under a mixed policy), wrap, fit, strip in scope.
    policy = ctx.job.cfg.runtime.precision
    dtype = tfmot_layer_dtype(policy)
    with ctx.job.strategy.scope():
        model = rebuild(
            src,
            policy,
            float32_layers=names if dtype else (),
            whole_layers=_whole(ctx, kind, names),
        )
        with sharding.kept_whole():  # tfmot's wrappers cannot hold a ShardedVariable
            wrapped = wrap(model, dtype)
        _compile(wrapped, ctx, ft)
    info = _fit(ctx, ft, wrapped, lib.callbacks(_log_dir(ctx, kind)), kind)
    with ctx.job.strategy.scope(), sharding.kept_whole():  # the stripped layers take whole arrays
        stripped = lib.strip(wrapped)
    info["layers"] = names
    return rebuild(
        stripped, "float32"
    ), info  # every worker reads the weights (a collective under MWMS)


def prune_phase(ctx: Context, ft: FineTune, src, spec: prune_lib.PruneSpec):
    """Prunes ``src`` (strategy-free); returns ``(stripped float32 copy, phase info)``."""
    names = prune_lib.prunable_names(src, spec)
    return _strip_phase(
        ctx,
        ft,
        src,
        "prune",
        names,
        lambda model, dtype: prune_lib.wrap(
            model, spec, ft.total_steps, names, wrapper_dtype=dtype
        ),
        prune_lib,
    )


def cluster_phase(ctx: Context, ft: FineTune, src, spec: cluster_lib.ClusterSpec):
    """Clusters ``src``; returns ``(stripped float32 copy, phase info)``."""
    names = cluster_lib.clusterable_names(src, spec)
    return _strip_phase(
        ctx,
        ft,
        src,
        "cluster",
        names,
        lambda model, dtype: cluster_lib.wrap(model, spec, names, wrapper_dtype=dtype),
        cluster_lib,
    )


def qat_phase(ctx: Context, ft: FineTune, src, spec: quantize_lib.QatSpec):
    """Quantization-aware training of ``src``; returns ``(default-scheme QAT copy, phase info)``."""
    policy = ctx.job.cfg.runtime.precision
    names = quantize_lib.quantizable_names(src, spec)
    with ctx.job.strategy.scope():
        model = rebuild(src, policy, float32_layers=names, whole_layers=_whole(ctx, "qat", names))
        with sharding.kept_whole():  # quantize_apply rebuilds every layer; tfmot needs them whole
            wrapped = quantize_lib.wrap(model, spec, names)
        _compile(wrapped, ctx, ft)
    info = _fit(ctx, ft, wrapped, [], "qat")
    info.update(layers=names, scheme=spec.scheme)
    weights = quantize_lib.read_named_weights(wrapped)  # every worker: a collective under MWMS
    return quantize_lib.savable_copy(wrapped, rebuild(src, "float32"), names, weights), info


def _tune(ctx: Context, ft: FineTune, src, kind: str):
    # A structural phase's model is plain: rebuild it in scope under the policy, fit, read it back.
    with ctx.job.strategy.scope():
        model = rebuild(src, ctx.job.cfg.runtime.precision)
        _compile(model, ctx, ft)
    info = _fit(ctx, ft, model, [], kind)
    return rebuild(
        model, "float32"
    ), info  # every worker reads the weights (a collective under MWMS)


def low_rank_phase(ctx: Context, ft: FineTune, src, spec: low_rank_lib.LowRankSpec):
    """Factorizes ``src`` by truncated SVD and fine-tunes it; returns ``(float32 model, phase info)``."""
    decided = low_rank_lib.plan(src, spec)
    model, info = _tune(ctx, ft, low_rank_lib.factorize(src, decided.ranks, spec.conv), "low_rank")
    info.update(layers=sorted(decided.ranks), **decided.to_dict())
    return model, info


def channel_prune_phase(ctx: Context, ft: FineTune, src, spec: channel_lib.ChannelSpec):
    """Removes channels of ``src`` in ``spec.iterations`` steps, fine-tuning after each.

    Each step aims at an equal share of the way to the target, measured on the original model:
    ``flops`` of its multiply-adds, or ``ratio`` of its prunable channels; a ``latency_us`` step
    goes its share of the way from the latency its latency table measures now. The chief alone
    times the table and, at the end, the result (``latency.measured_us``).

    Returns:
        ``(float32 model, phase info)``; the info holds every step's plan and the widths from
        the original to the result.
    """
    original = sum(model_macs(src).values())
    model, steps, fits = src, [], []
    for k in range(1, spec.iterations + 1):
        current = sum(model_macs(model).values())
        share = 1 - (1 - spec.flops) * k / spec.iterations
        step = dataclasses.replace(
            spec,
            flops=min(1.0, share * original / current),
            iterations=1,
            ratio=1 - (1 - spec.ratio) ** (1 / spec.iterations) if spec.ratio else 0.0,
        )
        batches = (
            list(ctx.job.dataset("train").take(spec.taylor_batches))
            if spec.importance == "taylor"
            else None
        )  # read deterministically: every worker scores the same batches
        decided = channel_lib.plan(
            model,
            step,
            batches,
            measure=_chief_measures(ctx, spec),
            steps_left=spec.iterations - k + 1,
        )
        model, info = _tune(ctx, ft, channel_lib.prune_channels(decided), "channel_prune")
        steps.append(decided.to_dict())
        fits.append(info)
    widths = {
        name: [before, steps[-1]["widths"][name][1]]
        for name, (before, _) in steps[0]["widths"].items()
    }
    info = dict(
        fits[-1],
        epochs=sum(f["epochs"] for f in fits),
        steps=sum(f["steps"] for f in fits),
        seconds=round(sum(f["seconds"] for f in fits), 3),
    )
    info.update(
        layers=sorted(n for n, (b, a) in widths.items() if a < b),
        widths=widths,
        pinned=steps[0]["pinned"],
        macs_before=original,
        macs_after=steps[-1]["macs_after"],
        iterations=steps,
    )
    if spec.latency_us:
        info["latency"] = {
            "target_us": spec.latency_us,
            "threads": spec.latency_threads,
            "before_us": steps[0]["latency"]["before_us"],
            "predicted_us": steps[-1]["latency"]["predicted_us"],
            "measured_us": round(
                float(
                    from_chief(
                        ctx.job.strategy,
                        ctx.job.chief,
                        1,
                        lambda: [latency_lib.model_us(model, threads=spec.latency_threads)],
                    )[0]
                ),
                2,
            ),
        }
    return model, info


def _chief_measures(ctx: Context, spec: channel_lib.ChannelSpec):
    """The latency table's timings: measured by the chief alone, the same on every worker."""

    def measure(model, entries):
        return from_chief(
            ctx.job.strategy,
            ctx.job.chief,
            len(entries) + 1,
            lambda: latency_lib.time_signatures(model, entries, threads=spec.latency_threads),
        )

    return measure


_RUN = {
    "prune": prune_phase,
    "cluster": cluster_phase,
    "qat": qat_phase,
    "low_rank": low_rank_phase,
    "channel_prune": channel_prune_phase,
}


def run_chain(ctx: Context, fine_tunes: dict[str, FineTune], base, chain: list[tuple[str, object]]):
    """Runs phases ``[(kind, spec), ...]`` from ``base``; reuses a chain prefix run earlier in ``ctx``.

    Comparing techniques in one job (e.g. prune, pqat and pcqat) shares their first phase
    instead of repeating identical fine-tuning; a reused phase's info says ``reused: true``.

    Args:
        ctx: The job.
        fine_tunes: Phase kind -> how long and how fast it fine-tunes.
        base: The strategy-free model to start from.
        chain: The phases.

    Returns:
        ``(result model, [phase info, ...], the model the last phase started from)``: a QAT
        result's float architecture is that of the model it was trained from.
    """
    src, infos, key = base, [], (id(base),)
    entered = base
    for kind, spec in chain:
        entered = src
        ft = fine_tunes[kind]
        key = key + ((kind, spec, ft),)
        if key in ctx.cache:
            src, info = ctx.cache[key]
            infos.append(dict(info, reused=True))
            continue
        src, info = _RUN[kind](ctx, ft, src, spec)
        ctx.cache[key] = (src, info)
        infos.append(info)
    return src, infos, entered
