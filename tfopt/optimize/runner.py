"""Fine-tuning a trained run with tfmot techniques under any strategy and precision policy.

One job: validate TF_CONFIG and the settings -> create the strategy (the first TensorFlow work:
MultiWorkerMirrored needs it) -> load the input run's model outside the strategy -> run each
technique's phases (:mod:`tfopt.optimize.phases`) -> the chief evaluates the strategy-free result
on the test split, tabulates the stripped weights per layer and commits a run directory per
technique (model.keras, saved_model, layers.json/.txt, run.json, TensorBoard summaries).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace

from tfopt.core._keras import keras

from tfopt.compress import channel_prune as channel_lib
from tfopt.compress import cluster as cluster_lib
from tfopt.compress import low_rank as low_rank_lib
from tfopt.compress import prune as prune_lib
from tfopt.compress import quantize as quantize_lib
from tfopt.compress import techniques
from tfopt.compress.common import (
    OptimizeError,
    Selection,
    check_model,
    compile_for_eval,
    format_table,
    rebuild,
    total_sparsity,
    weight_table,
    weights_gzip_bytes,
)
from tfopt.config import RunConfig
from tfopt.core.errors import TfoptError
from tfopt.core.fileio import atomic_path, write_json, write_text
from tfopt.models import inputs, sources
from tfopt.models.io import save_model
from tfopt.optimize.phases import Context, FineTune, run_chain
from tfopt.privacy.job import not_covered
from tfopt.runs import RunRecord, fingerprint, fresh_dir, load_input, refuse_input_as_output
from tfopt.runtime import precision as precision_lib
from tfopt.runtime.job import Job, cluster_id, result_config, run_record, weights_digest
from tfopt.runtime.rundir import RunDir


@dataclass(frozen=True)
class OptimizeSettings:
    """What to do to the model; the data, strategy and precision come from the RunConfig."""

    technique: str = "prune"
    prune: prune_lib.PruneSpec = field(default_factory=prune_lib.PruneSpec)
    cluster: cluster_lib.ClusterSpec = field(default_factory=cluster_lib.ClusterSpec)
    low_rank: low_rank_lib.LowRankSpec = field(default_factory=low_rank_lib.LowRankSpec)
    channels: channel_lib.ChannelSpec = field(default_factory=channel_lib.ChannelSpec)
    qat_selection: Selection = field(default_factory=Selection)
    epochs: int = 1  # per phase
    phase_epochs: tuple[
        tuple[str, int], ...
    ] = ()  # e.g. (("prune", 3),): overrides ``epochs`` per phase kind
    steps_per_epoch: int = 0  # 0 = one pass over the training split
    learning_rate: float = 5e-4
    tensorboard: bool = True
    saved_model: bool = True
    trust_model: bool = False

    def validate(self) -> OptimizeSettings:
        """Raises OptimizeError for a bad technique, spec or fine-tuning length."""
        techniques.get(self.technique)
        self.prune.validate()
        self.cluster.validate()
        self.low_rank.validate()
        self.channels.validate()
        if self.epochs < 1 or self.steps_per_epoch < 0 or self.learning_rate <= 0:
            raise OptimizeError(
                f"epochs={self.epochs} must be >= 1, steps_per_epoch={self.steps_per_epoch} >= 0 "
                f"and learning_rate={self.learning_rate} > 0"
            )
        for kind, epochs in self.phase_epochs:
            if kind not in techniques.PHASE_KINDS or epochs < 1:
                raise OptimizeError(
                    f"phase epochs {kind}={epochs} is not valid; give "
                    f"{'|'.join(techniques.PHASE_KINDS)}=N with N >= 1"
                )
        return self

    def to_dict(self) -> dict:
        """The settings as JSON-ready data (what the resume fingerprint covers)."""
        return {
            "technique": self.technique,
            "prune": self.prune.to_dict(),
            "cluster": self.cluster.to_dict(),
            "low_rank": self.low_rank.to_dict(),
            "channels": self.channels.to_dict(),
            "qat_selection": self.qat_selection.to_dict(),
            "epochs": self.epochs,
            "phase_epochs": dict(self.phase_epochs),
            "steps_per_epoch": self.steps_per_epoch,
            "learning_rate": self.learning_rate,
        }

    def epochs_of(self, kind: str) -> int:
        """Fine-tuning epochs of a phase kind (``phase_epochs`` first, then ``epochs``)."""
        return dict(self.phase_epochs).get(kind, self.epochs)

    def chain(self) -> list[tuple[str, object]]:
        """The technique's phases with the spec each one runs."""
        tech = techniques.get(self.technique)
        prune_spec = replace(self.prune, m_by_n=tech.m_by_n) if tech.m_by_n else self.prune
        # PCQAT's clustering must keep the zeros pruning made.
        cluster_spec = (
            replace(self.cluster, preserve_sparsity=True)
            if "prune" in tech.phases
            else self.cluster
        )
        specs = {
            "prune": prune_spec,
            "cluster": cluster_spec,
            "low_rank": self.low_rank,
            "channel_prune": self.channels,
            "qat": quantize_lib.QatSpec(tech.qat_scheme, self.qat_selection),
        }
        return [(kind, specs[kind].validate()) for kind in tech.phases]


def default_output(from_dir: str, technique: str, cluster: str | None = None) -> str:
    """``<from>-<technique>`` beside the input run (``-2``, ``-3``, ... when taken); ``from_dir`` is a run's
    path or a model file's without its suffix (:attr:`tfopt.runs.Run.stem`)."""
    return fresh_dir(os.path.abspath(from_dir).rstrip(os.sep) + "-" + technique, cluster)


def optimize(
    from_dir: str,
    cfg: RunConfig,
    settings: OptimizeSettings,
    out_dir: str | None = None,
    overwrite: bool = False,
) -> RunRecord | None:
    """Fine-tunes the model of run ``from_dir`` with ``settings.technique`` and writes a new run.

    Args:
        from_dir: A run directory (``python -m tfopt.train`` or another stage), or a model file
            (``.keras``, ``.h5``, a SavedModel directory) trained on ``cfg.data``.
        cfg: Data, runtime (strategy, precision) and train settings (``train.verbose``,
            ``train.steps_per_execution``, ``data.*``); usually the input run's config with
            the user's overrides.
        settings: The technique and its parameters.
        out_dir: The new run directory (default ``<from>-<technique>``); never ``from_dir``.
        overwrite: Replace a finished run at ``out_dir``.

    Returns:
        The new RunRecord (None in non-chief workers, which write nothing; a parameter-server
        worker/ps task serves until the launcher ends it).

    Raises:
        TfoptError: bad input run, TF_CONFIG or settings, or a layer tfmot cannot handle.
    """
    return run(from_dir, cfg, [settings], [out_dir], keep_going=False, overwrite=overwrite)[
        0
    ].record


@dataclass
class Outcome:
    """What one technique of :func:`run` produced.

    Attributes:
        technique: The technique's name.
        output: Its run directory.
        record: The committed RunRecord (None outside the chief, which alone writes, and on error).
        weights_sha256: The digest of the final weights (every worker; equal when in sync).
        error: The TfoptError's message when the technique failed (``keep_going``), else None.
    """

    technique: str
    output: str
    record: RunRecord | None = None
    weights_sha256: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the technique finished."""
        return self.error is None

    @property
    def failed_checks(self) -> list[str]:
        """The names of the result's checks that failed (``run.json``'s ``optimize.checks``)."""
        checks = self.record.section["checks"] if self.record else {}
        return [name for name, check in checks.items() if not check["ok"]]


def run(
    from_dir: str,
    cfg: RunConfig,
    settings_list: list[OptimizeSettings],
    out_dirs: list[str | None],
    keep_going: bool = True,
    overwrite: bool = False,
) -> list[Outcome]:
    """Runs several techniques on one input run in one job (one strategy, one model load).

    A multi-worker strategy can be created once per process, so comparing techniques under
    MultiWorkerMirrored or parameter servers needs them in one job; identical leading phases
    (e.g. the pruning of prune, pqat and pcqat) run once.

    Args:
        from_dir: The input run directory.
        cfg: As for :func:`optimize`.
        settings_list: One entry per technique, in order.
        out_dirs: The output directory of each (None = ``<from>-<technique>``).
        keep_going: Record a technique's TfoptError and go on with the next (otherwise raise).
        overwrite: Replace finished runs at the output directories.

    Returns:
        One :class:`Outcome` per technique, in order.
    """
    # JSON (or a file's hash) only: no TensorFlow op before MultiWorkerMirrored exists
    source = load_input(from_dir, cfg)
    job = Job(cfg, "optimize", out_dir=False, build_model=sources.build_model)
    cluster = cluster_id(job.cluster)
    dirs = []
    try:
        for settings, out in zip(settings_list, out_dirs):
            settings.validate()
            pick = (
                (lambda t=settings.technique: default_output(source.stem, t, cluster))
                if not out
                else None
            )
            path = os.path.abspath(out or pick())
            refuse_input_as_output(path, [source.source])
            options = {
                "source": source.source,
                "source_digest": source.digest,
                **settings.to_dict(),
            }
            rd = RunDir(
                path,
                fingerprint("optimize", result_config(cfg, "optimize"), options),
                {"optimize": options},
                overwrite=overwrite,
                chief=job.chief,
                cluster=cluster,
                pick=pick,
            )
            dirs.append(rd)
            rd.check()
        return _run_all(job, source, from_dir, settings_list, dirs, keep_going)
    finally:
        for rd in dirs:
            rd.release()


def _run_all(
    job: Job,
    source,
    from_dir: str,
    settings_list: list[OptimizeSettings],
    dirs: list[RunDir],
    keep_going: bool,
) -> list[Outcome]:
    results = []
    with job:
        base = check_model(
            sources.load_stage_input(
                source, job.info.image_shape, job.info.num_classes, settings_list[0].trust_model
            ),
            f"model of {from_dir!r}",
        )
        inputs.adopt(job, base, from_dir, origin="config")
        ctx = Context(job=job)
        for settings, rd in zip(settings_list, dirs):
            outcome = Outcome(settings.technique, rd.path)
            try:
                outcome.record, outcome.weights_sha256 = _optimize_one(
                    ctx, source, base, settings, rd
                )
            except TfoptError as e:
                if not keep_going:
                    raise
                outcome.error = str(e)
            results.append(outcome)
    return results


def fine_tunes_of(ctx: Context, settings: OptimizeSettings) -> dict[str, FineTune]:
    """The length and learning rate of every phase kind's fine-tuning under ``ctx``'s job."""
    steps = ctx.job.steps_per_epoch(settings.steps_per_epoch)
    spe = ctx.job.steps_per_execution(steps)
    return {
        kind: FineTune(settings.epochs_of(kind), steps, settings.learning_rate, spe)
        for kind in techniques.PHASE_KINDS
    }


def resolved(settings: OptimizeSettings, fine_tunes: dict[str, FineTune]) -> OptimizeSettings:
    """Settings with pruning's automatic mask-update frequency (0) resolved for this phase length."""
    if settings.prune.frequency:
        return settings
    frequency = prune_lib.auto_frequency(fine_tunes["prune"].total_steps)
    return replace(settings, prune=replace(settings.prune, frequency=frequency))


def _optimize_one(
    ctx: Context, source, base, settings: OptimizeSettings, rd: RunDir
) -> tuple[RunRecord | None, str]:
    job = ctx.job
    scratch = tempfile.mkdtemp(prefix="tfopt-optimize-")
    try:
        precision_lib.set_policy(job.cfg.runtime.precision)
        job.attach(rd)  # backups (--backup-every, each epoch) in this run's work directory
        ctx.log_dir = os.path.join(scratch, "tensorboard") if settings.tensorboard else None
        ctx.phases_run = 0
        fine_tunes = fine_tunes_of(ctx, settings)
        settings = resolved(settings, fine_tunes)
        started = time.perf_counter()
        final, infos, entered = run_chain(ctx, fine_tunes, base, settings.chain())
        seconds = time.perf_counter() - started
        digest = weights_digest(final)  # equal on every worker when the replicas stayed in sync
        if not job.chief:
            return None, digest
        keras.mixed_precision.set_global_policy(
            "float32"
        )  # evaluation copies and saved models are float32
        return _write(
            ctx, source, base, settings, (final, entered), infos, rd, seconds, digest
        ), digest
    finally:
        ctx.log_dir = None
        shutil.rmtree(scratch, ignore_errors=True)


def _baseline(ctx: Context, base, test) -> dict:
    # The input model's own test metrics, once per job: every technique is compared with them.
    if "baseline" not in ctx.cache:
        ctx.cache["baseline"] = compile_for_eval(rebuild(base, "float32")).evaluate(
            test, return_dict=True, verbose=0
        )
    return ctx.cache["baseline"]


def _checks(float_model, chain, infos) -> dict:
    checks = {}
    layers = {info["phase"]: info["layers"] for info in infos}
    specs = dict(chain)
    if "prune" in specs:
        spec = specs["prune"]
        if spec.m_by_n:
            checks["m_by_n"] = prune_lib.check_m_by_n(float_model, spec.m_by_n, layers["prune"])
        else:
            rows = [r for r in weight_table(float_model) if r.layer in layers["prune"]]
            low = [r.layer for r in rows if r.sparsity < spec.sparsity - 0.01]  # rounding aside
            checks["sparsity"] = {"target": spec.sparsity, "ok": not low, "below_target": low}
            if tuple(spec.block_size) != (1, 1):
                checks["blocks"] = prune_lib.check_blocks(
                    float_model, spec.block_size, layers["prune"]
                )
    if "cluster" in specs:
        # tfmot's cluster-preserving QAT re-clusters a Conv2D per output channel when every
        # channel uses about as many values; the clusters then survive per channel.
        checks["clusters"] = cluster_lib.check_clusters(
            float_model, specs["cluster"], layers["cluster"], conv_per_channel="qat" in specs
        )
    if "low_rank" in specs:
        checks["flops"] = low_rank_lib.check_flops(
            float_model, specs["low_rank"], next(i for i in infos if i["phase"] == "low_rank")
        )
    if "channel_prune" in specs:
        checks["channels"] = channel_lib.check_widths(
            float_model,
            specs["channel_prune"],
            next(i for i in infos if i["phase"] == "channel_prune"),
        )
    return checks


def _weight_stats(ctx: Context, base, float_model, rows: list, infos: list) -> dict:
    """The result's sparsity (of the layers pruning touched), clusters per clustered layer and
    gzip-compressed weight size against the input's."""
    pruned = [n for i in infos if i["phase"] == "prune" for n in i["layers"]]
    clustered = [n for i in infos if i["phase"] == "cluster" for n in i["layers"]]
    if "base_gzip" not in ctx.cache:
        ctx.cache["base_gzip"] = weights_gzip_bytes(base)
    gz, gz_base = weights_gzip_bytes(float_model), ctx.cache["base_gzip"]
    return {
        "sparsity": total_sparsity([r for r in rows if r.layer in pruned] if pruned else rows),
        "model_sparsity": total_sparsity(rows),
        "clusters": {r.layer: r.unique for r in rows if r.layer in clustered},
        "clusters_per_channel_max": {
            r.layer: r.unique_per_channel_max for r in rows if r.layer in clustered
        },
        "weights_gzip_bytes": gz,
        "source_weights_gzip_bytes": gz_base,
        "gzip_ratio": round(gz_base / gz, 3) if gz else None,
    }


def _write(
    ctx: Context,
    source,
    base,
    settings: OptimizeSettings,
    result,
    infos: list,
    rd: RunDir,
    seconds: float,
    digest: str,
) -> RunRecord:
    job = ctx.job
    final, entered = (
        result  # the model, and the one its last phase started from (a QAT model's float twin)
    )
    test = job.dataset("test")
    baseline = _baseline(ctx, base, test)
    metrics = compile_for_eval(final).evaluate(test, return_dict=True, verbose=0)
    is_qat = quantize_lib.is_qat_model(final)
    float_model = (
        quantize_lib.inner_float_model(final, rebuild(entered, "float32")) if is_qat else final
    )
    chain = settings.chain()
    specs = dict(chain)
    rows = weight_table(float_model, m_by_n=specs["prune"].m_by_n if "prune" in specs else None)
    precision = job.cfg.runtime.precision
    section = {
        "source": {
            "run": source.source,
            "form": "file" if source.model_file else "run",
            "digest": source.digest,
            "test_accuracy": float(baseline["accuracy"]),
            "test_loss": float(baseline["loss"]),
        },
        "technique": settings.technique,
        "description": techniques.get(settings.technique).description,
        "phases": infos,
        "seconds": round(seconds, 3),
        "learning_rate": settings.learning_rate,
        **{kind: spec.to_dict() for kind, spec in chain},
        "precision_notes": techniques.mixed_notes(settings.technique, precision),
        **_weight_stats(ctx, base, float_model, rows, infos),
        "checks": _checks(float_model, chain, infos),
        # QAT results are saved as default-scheme QAT models (see quantize.savable_copy).
        "quantized_model": is_qat,
        "accuracy_delta": round(float(metrics["accuracy"]) - float(baseline["accuracy"]), 5),
    }
    artifacts = _save(ctx, final, rows, rd, settings.saved_model)
    epochs = sum(i["epochs"] for i in infos if not i.get("reused"))
    notes = job.judge(float_model, float(metrics["accuracy"])) + not_covered(job, source, epochs)
    record = run_record(
        "optimize",
        job.cfg,
        rd.path,
        strategy=job.strategy_section(),
        data=job.data_section(),
        model={
            "name": source.config.model.name,
            "params": int(float_model.count_params()),
            "keras_bytes": os.path.getsize(os.path.join(rd.work, "model.keras")),
        },
        train={
            "epochs": epochs,
            "seconds": round(seconds, 3),
            "global_batch_size": job.cfg.data.global_batch_size,
        },
        history=[
            {k: v for k, v in i.items() if k.startswith("train_") or k in ("phase", "epochs")}
            for i in infos
        ],
        metrics={f"test_{k}": float(v) for k, v in metrics.items()},
        artifacts=artifacts,
        section=section,
        weights_sha256=digest,
        fingerprint=rd.fingerprint,
        warnings=notes,
    )
    rd.commit(record)
    return record


def _save(ctx: Context, final, rows: list, rd: RunDir, saved_model: bool) -> dict:
    """Writes the model, its TensorBoard logs and its per-layer table into the run's work
    directory; returns the artifacts, relative to it."""
    rd.open()  # already open after a fit; kept for a chain without one
    artifacts = save_model(final, rd.work) if saved_model else _save_keras(final, rd.work)
    if ctx.log_dir and os.path.isdir(ctx.log_dir):
        shutil.copytree(ctx.log_dir, os.path.join(rd.work, "tensorboard"))
    write_json(os.path.join(rd.work, "layers.json"), [r.__dict__ for r in rows])
    write_text(os.path.join(rd.work, "layers.txt"), format_table(rows) + "\n")
    artifacts = {k: os.path.relpath(v, rd.work) for k, v in artifacts.items()}
    return {**artifacts, "layers": "layers.json", "layers_text": "layers.txt"}


def _save_keras(model, out_dir: str) -> dict:
    path = os.path.join(out_dir, "model.keras")
    with atomic_path(path) as tmp:
        model.save(tmp)
    return {"keras": path}
