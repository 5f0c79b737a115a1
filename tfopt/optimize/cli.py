"""``python -m tfopt.optimize``: prune, quantize-aware train or cluster a trained run.

    python -m tfopt.optimize --from runs/mnist --technique prune --sparsity 0.8 --strategy mirrored
    python -m tfopt.optimize --from runs/mnist --technique prune_2of4
    python -m tfopt.optimize --from runs/mnist --technique pqat --precision mixed_bfloat16
    python -m tfopt.optimize --from runs/mnist --inspect
    python -m tfopt.launch --workers 2 -- python -m tfopt.optimize --from runs/mnist --technique qat \\
        --strategy multi_worker_mirrored
"""

from __future__ import annotations

import json
import os
import sys

from tfopt import cli
from tfopt import config as config_lib
from tfopt.compress.techniques import TECHNIQUES
from tfopt.core import flagcheck
from tfopt.core.errors import ConfigError
from tfopt.core.specs import PRECISIONS, STRATEGIES

PROG = "tfopt optimize"
DEFAULT_PRUNE_EPOCHS = 3  # and low-rank: structural changes need time to recover
TECHNIQUE_NAMES = tuple(TECHNIQUES)


# Which phase reads each technique-specific flag (through the spec settings_for fills and the
# phase's code): a phase kind, or "magnitude" = a pruning phase on a sparsity schedule.
# prune_2of4's pruning phase reads --policy only: tfmot computes its 2:4 mask once, at step 1,
# with no schedule (tfmot's pruning_impl), its check is the 2:4 one, and it excludes blocks.
FLAG_PHASES = {
    "--sparsity": "magnitude",
    "--schedule": "magnitude",
    "--initial-sparsity": "magnitude",
    "--begin-step": "magnitude",
    "--end-step": "magnitude",
    "--frequency": "magnitude",
    "--block-size": "magnitude",
    "--policy": "prune",
    "--clusters": "cluster",
    "--centroid-init": "cluster",
    "--per-channel": "cluster",
    "--low-rank-by": "low_rank",
    "--low-rank-flops": "low_rank",
    "--low-rank-energy": "low_rank",
    "--low-rank-round-to": "low_rank",
    "--low-rank-conv": "low_rank",
    "--channels-flops": "channel_prune",
    "--channels-ratio": "channel_prune",
    "--target-latency-us": "channel_prune",
    "--latency-threads": "channel_prune",
    "--importance": "channel_prune",
    "--taylor-batches": "channel_prune",
    "--ranking": "channel_prune",
    "--round-to": "channel_prune",
    "--prune-iterations": "channel_prune",
}


def _reads(technique: str) -> set[str]:
    """What of FLAG_PHASES a technique's phases read."""
    t = TECHNIQUES[technique]
    return set(t.phases) | ({"magnitude"} if "prune" in t.phases and t.m_by_n is None else set())


#: flag -> the techniques that use it (FLAG_PHASES spelled out over the registry).
FLAG_USERS = {
    flag: tuple(t for t in TECHNIQUE_NAMES if phase in _reads(t))
    for flag, phase in FLAG_PHASES.items()
}


def _csv(text: str | None) -> tuple[str, ...]:
    return tuple(x.strip() for x in (text or "").split(",") if x.strip())


def build_parser() -> cli.ArgumentParser:
    """The argument parser (no TensorFlow import: ``--help`` stays fast)."""
    p = cli.ArgumentParser(
        prog=PROG,
        description=__doc__.splitlines()[0],
        epilog="techniques: "
        + ", ".join(TECHNIQUE_NAMES)
        + "; exit codes: 0 done, 1 a sparsity/cluster/2:4 check failed, 2 user error",
    )
    p.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="RUN|MODEL",
        help="the trained run to optimize, or a model file (.keras, .h5, a SavedModel directory) with --dataset",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--technique", help="one technique, or several separated by commas (run in one job)"
    )
    what.add_argument(
        "--inspect", action="store_true", help="list what each layer supports and exit"
    )
    p.add_argument(
        "--output",
        "-o",
        help="new run directory (default <from>-<technique>); with several "
        "techniques, a parent directory holding one run per technique",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace a finished run at the output directory"
    )
    p.add_argument(
        "--trust-model",
        action="store_true",
        help="load a model file that can run code (only if trusted)",
    )
    p.add_argument(
        "--layers", help="comma-separated layer names to optimize (default: every supported layer)"
    )
    p.add_argument(
        "--layer-types", help="comma-separated layer classes to optimize, e.g. Conv2D,Dense"
    )
    g = p.add_argument_group("pruning")
    g.add_argument(
        "--sparsity", type=float, default=0.8, help="target share of zero weights (default 0.8)"
    )
    g.add_argument(
        "--schedule",
        default="polynomial",
        help="polynomial (PolynomialDecay from --initial-sparsity, the default) or constant (ConstantSparsity)",
    )
    g.add_argument(
        "--initial-sparsity", type=float, default=0.0, help="polynomial schedule start (default 0)"
    )
    g.add_argument(
        "--begin-step", type=int, default=0, help="the step pruning starts at (default 0)"
    )
    g.add_argument(
        "--end-step",
        type=int,
        default=-1,
        help="-1 = end of the phase (constant) / two thirds into it (polynomial)",
    )
    g.add_argument(
        "--frequency",
        type=int,
        default=0,
        help="mask update every N steps (default: ~20 per phase, at most every 100)",
    )
    g.add_argument(
        "--block-size",
        default="1,1",
        metavar="ROWS,COLS",
        help="block sparsity of Dense kernels [in, out], e.g. 4,1 (runs of 4 inputs: contiguous in "
        "TFLite, smaller gzip); convolutions stay unstructured (default 1,1 = unstructured)",
    )
    g.add_argument("--policy", default="none", help="none or xnnpack (PruneForLatencyOnXNNPack)")
    g = p.add_argument_group("clustering")
    g.add_argument("--clusters", type=int, default=16, help="centroids per kernel (default 16)")
    g.add_argument(
        "--centroid-init",
        default="kmeans_plus_plus",
        help="kmeans_plus_plus, density, linear, random",
    )
    g.add_argument(
        "--per-channel", action="store_true", help="one set of centroids per Conv2D output channel"
    )
    g = p.add_argument_group("low-rank factorization")
    g.add_argument(
        "--low-rank-by",
        default="flops",
        choices=("flops", "energy"),
        help="choose each layer's rank by a FLOPs budget for the model or by the energy each kernel keeps "
        "(default flops)",
    )
    g.add_argument(
        "--low-rank-flops",
        type=float,
        default=0.5,
        help="target multiply-adds as a share of the model's (default 0.5)",
    )
    g.add_argument(
        "--low-rank-energy",
        type=float,
        default=0.9,
        help="share of each kernel's squared singular values kept (default 0.9)",
    )
    g.add_argument(
        "--low-rank-round-to",
        type=int,
        default=1,
        help="ranks are multiples of N, e.g. 8 (default 1)",
    )
    g.add_argument(
        "--low-rank-conv",
        default="pointwise",
        choices=("pointwise", "spatial"),
        help="a k x k Conv2D becomes k x k then 1 x 1 (pointwise) or k x 1 then 1 x k (spatial) "
        "(default pointwise)",
    )
    g = p.add_argument_group("channel pruning")
    g.add_argument(
        "--channels-flops",
        type=float,
        default=0.5,
        help="target multiply-adds as a share of the model's (default 0.5)",
    )
    g.add_argument(
        "--channels-ratio",
        type=float,
        default=0.0,
        help="remove this share of the prunable channels instead of aiming at --channels-flops",
    )
    g.add_argument(
        "--target-latency-us",
        type=float,
        default=0.0,
        metavar="US",
        help="aim at this LiteRT p50 (microseconds, batch 1, float .tflite) instead of --channels-flops, "
        "predicted from a table of timed layer widths (default 0: off)",
    )
    g.add_argument(
        "--latency-threads",
        type=int,
        default=1,
        help="interpreter threads --target-latency-us is measured with (default 1)",
    )
    g.add_argument(
        "--importance",
        default="l1",
        choices=("l1", "l2", "bn", "taylor"),
        help="channel importance: kernel L1 or L2 norm, the following batch norm's |gamma|, or first-order "
        "Taylor on --taylor-batches training batches (default l1)",
    )
    g.add_argument(
        "--taylor-batches",
        type=int,
        default=8,
        help="batches taylor importance averages (default 8)",
    )
    g.add_argument(
        "--ranking",
        default="global",
        choices=("global", "uniform"),
        help="rank channels model-wide or remove the same share of every group (default global)",
    )
    g.add_argument(
        "--round-to",
        type=int,
        default=1,
        help="round widths up to a multiple of N, e.g. 8 (default 1)",
    )
    g.add_argument(
        "--prune-iterations",
        type=int,
        default=1,
        help="reach the target in N prune + fine-tune steps, each fine-tuning --epochs (default 1)",
    )
    g = p.add_argument_group("data (a run directory brings its own)")
    g.add_argument(
        "--dataset",
        help="a model file's data: mnist, digits, folder:PATH, tfds:NAME, tfrecord:GLOB ...",
    )
    g.add_argument("--data-dir", help="dataset cache directory")
    g.add_argument("--image-size", metavar="HxW", help="resize images to HxW")
    g.add_argument("--channels", type=int, choices=(1, 3), help="convert images to 1 or 3 channels")
    g = p.add_argument_group("fine-tuning")
    g.add_argument("--strategy", help=f"one of: {', '.join(STRATEGIES)} (default: the input run's)")
    g.add_argument(
        "--precision", help=f"one of: {', '.join(PRECISIONS)} (default: the input run's)"
    )
    g.add_argument(
        "--cpu-replicas", type=int, help="logical CPU devices for `mirrored` without GPUs"
    )
    g.add_argument(
        "--collective",
        help=f"multi_worker_mirrored all-reduce: {', '.join(config_lib.COLLECTIVES)}",
    )
    cli.add_shard_variables(g)
    g.add_argument(
        "--epochs",
        type=int,
        help=f"epochs of every phase (default: {DEFAULT_PRUNE_EPOCHS} for pruning, low-rank and channel pruning, 1 for QAT and clustering)",
    )
    g.add_argument(
        "--phase-epochs",
        metavar="KIND=N[,...]",
        help="epochs of some phase kinds, e.g. prune=3,qat=1 (overrides --epochs for them)",
    )
    g.add_argument(
        "--steps-per-epoch", type=int, default=0, help="0 = one pass over the training split"
    )
    g.add_argument(
        "--lr",
        type=float,
        default=5e-4,
        help="fine-tuning learning rate (default 5e-4; cosine-decayed over each phase when the input "
        "run's train.lr_schedule is cosine, the default)",
    )
    g.add_argument("--batch-size", type=int, help="global batch size (default: the input run's)")
    g.add_argument("--limit", type=int, help="use only the first N records of each split")
    g.add_argument(
        "--backup-every",
        type=int,
        metavar="N",
        help="back up every N steps as well as at each epoch end (a restart resumes there)",
    )
    g.add_argument(
        "--deterministic",
        action="store_true",
        default=None,
        help="op determinism and a deterministic input: reruns and resumes give identical weights",
    )
    g.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value",
    )
    g.add_argument(
        "--no-tensorboard", action="store_true", help="no TensorBoard (pruning summaries) logs"
    )
    g.add_argument("--no-saved-model", action="store_true", help="write model.keras only (faster)")
    g.add_argument(
        "--report", metavar="FILE", help="also write a JSON list of each technique's outcome"
    )
    cli.add_verbosity(g, "no progress bar")
    return p


_FLAGS = {
    "strategy": ("runtime", "strategy"),
    "precision": ("runtime", "precision"),
    "cpu_replicas": ("runtime", "cpu_replicas"),
    "collective": ("runtime", "collective"),
    "batch_size": ("data", "global_batch_size"),
    "limit": ("data", "limit"),
    "backup_every": ("train", "backup_every"),
    "deterministic": ("runtime", "deterministic"),
}


def _file_config(args) -> config_lib.RunConfig:
    """The config a model file is fine-tuned with: defaults, ``--set``, then the data flags."""
    cfg = config_lib.apply_overrides(config_lib.RunConfig(), args.set)
    data = {
        key: getattr(args, key)
        for key in ("dataset", "data_dir", "image_size", "channels")
        if getattr(args, key) is not None
    }
    return config_lib.from_dict({"data": data}, cfg)


def resolve_config(args, base: config_lib.RunConfig) -> config_lib.RunConfig:
    """The input run's config, then ``--set`` overrides, then the dedicated flags."""
    cfg = config_lib.apply_overrides(base, args.set)
    raw: dict = {}
    for flag, (section, key) in _FLAGS.items():
        if getattr(args, flag) is not None:
            raw.setdefault(section, {})[key] = getattr(args, flag)
    raw.setdefault("runtime", {}).update(cli.shard_variables(args))
    raw.setdefault("train", {}).update(verbose=0 if args.quiet else 1)
    return config_lib.from_dict(raw, cfg)


def settings_for(args, technique: str):
    """The OptimizeSettings of one technique from the parsed flags.

    Without ``--frequency`` the pruning masks are updated about 20 times per phase (at most
    every 100 steps), counted from the real training split when the job starts.
    """
    from tfopt.compress.channel_prune import ChannelSpec
    from tfopt.compress.cluster import ClusterSpec
    from tfopt.compress.common import Selection
    from tfopt.compress.low_rank import LowRankSpec
    from tfopt.compress.prune import PruneSpec
    from tfopt.optimize.runner import OptimizeSettings

    phase_epochs = _phase_epochs(args.phase_epochs)
    for kind in ("prune", "low_rank", "channel_prune"):
        if args.epochs is None and kind not in dict(phase_epochs):
            # Pruning and factorization need time to recover (tfmot's guides fine-tune for a few epochs).
            phase_epochs += ((kind, DEFAULT_PRUNE_EPOCHS),)
    selection = Selection(_csv(args.layers), _csv(args.layer_types))
    prune = PruneSpec(
        sparsity=args.sparsity,
        schedule=args.schedule,
        initial_sparsity=args.initial_sparsity,
        begin_step=args.begin_step,
        end_step=args.end_step,
        frequency=args.frequency,
        block_size=_pair(args.block_size, "--block-size"),
        policy=args.policy,
        selection=selection,
    )
    return OptimizeSettings(
        technique=technique,
        prune=prune,
        cluster=ClusterSpec(
            clusters=args.clusters,
            init=args.centroid_init,
            per_channel=args.per_channel,
            selection=selection,
        ),
        low_rank=LowRankSpec(
            rank_by=args.low_rank_by,
            energy=args.low_rank_energy,
            flops=args.low_rank_flops,
            round_to=args.low_rank_round_to,
            conv=args.low_rank_conv,
            selection=selection,
        ),
        channels=ChannelSpec(
            flops=args.channels_flops,
            ratio=args.channels_ratio,
            importance=args.importance,
            ranking=args.ranking,
            round_to=args.round_to,
            iterations=args.prune_iterations,
            taylor_batches=args.taylor_batches,
            latency_us=args.target_latency_us,
            latency_threads=args.latency_threads,
            selection=selection,
        ),
        qat_selection=selection,
        epochs=1 if args.epochs is None else args.epochs,
        phase_epochs=phase_epochs,
        steps_per_epoch=args.steps_per_epoch,
        learning_rate=args.lr,
        tensorboard=not args.no_tensorboard,
        saved_model=not args.no_saved_model,
        trust_model=args.trust_model,
    )


def _pair(text: str, flag: str) -> tuple[int, int]:
    parts = _csv(text.replace("x", ","))
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ConfigError(f"{flag} {text!r} is not ROWS,COLS; e.g. {flag} 4,1")
    return int(parts[0]), int(parts[1])


def _phase_epochs(text: str | None) -> tuple[tuple[str, int], ...]:
    out = []
    for item in _csv(text):
        kind, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise ConfigError(f"--phase-epochs item {item!r} is not KIND=N; e.g. prune=3,qat=1")
        out.append((kind.strip(), int(value)))
    return tuple(out)


def _outputs(args, techniques: tuple[str, ...]) -> list[str | None]:
    if not args.output:
        return [None] * len(techniques)
    if len(techniques) == 1:
        return [args.output]
    return [os.path.join(args.output, t) for t in techniques]


def check_flags(args, given: set[str]) -> tuple[str, ...]:
    """Validates the technique names and refuses a technique flag none of them uses.

    Args:
        args: The parsed command line.
        given: The options given explicitly (:func:`tfopt.core.flagcheck.explicit`).

    Returns:
        The technique names (empty with ``--inspect``, which uses no technique flag).

    Raises:
        ConfigError: an unknown technique, or e.g. ``--sparsity`` with ``channel_prune``.
    """
    names = () if args.inspect else _csv(args.technique)
    if not args.inspect and not names:
        raise ConfigError(f"no technique given; choose from {', '.join(TECHNIQUE_NAMES)}")
    for name in names:
        if name not in TECHNIQUE_NAMES:
            raise ConfigError(
                f"technique {name!r} is not valid; choose one of {', '.join(TECHNIQUE_NAMES)}"
            )
    chosen = names or ("--inspect",)
    flagcheck.refuse_unused(
        FLAG_USERS, chosen, given, chosen_as=",".join(chosen), fix=lambda *_: _takes(chosen)
    )
    flagcheck.refuse_off(_read_by_value(args), given)
    return names


def _read_by_value(args) -> dict[str, tuple[bool, str, str, str | None]]:
    """The technique flags read only for some values of another (see flagcheck.refuse_off)."""
    target = (
        f"--channels-ratio {args.channels_ratio:g}"
        if args.channels_ratio
        else f"--target-latency-us {args.target_latency_us:g}"
    )
    return {
        "--taylor-batches": (
            args.importance == "taylor",
            f"--importance {args.importance}",
            "--importance taylor",
            None,
        ),
        "--latency-threads": (
            bool(args.target_latency_us),
            "no --target-latency-us",
            "--target-latency-us US",
            None,
        ),
        "--channels-flops": (
            not (args.channels_ratio or args.target_latency_us),
            target,
            "no other channel target",
            f"give one target: --channels-flops or {target.split()[0]}",
        ),
        "--initial-sparsity": (
            args.schedule != "constant",
            "--schedule constant",
            "--schedule polynomial",
            None,
        ),
        "--low-rank-flops": (
            args.low_rank_by == "flops",
            f"--low-rank-by {args.low_rank_by}",
            "--low-rank-by flops",
            None,
        ),
        "--low-rank-energy": (
            args.low_rank_by == "energy",
            f"--low-rank-by {args.low_rank_by}",
            "--low-rank-by energy",
            None,
        ),
    }


def _takes(chosen: tuple[str, ...]) -> str:
    """What each chosen technique takes instead, e.g. ``qat takes none of these flags``."""
    parts = []
    for name in chosen:
        flags = [flag for flag, users in FLAG_USERS.items() if name in users]
        parts.append(f"{name} takes {flagcheck.join(flags) if flags else 'none of these flags'}")
    return "; ".join(parts)


def _body(args, given: set[str]) -> int:
    from tfopt.runs import is_model_file, load_input

    names = check_flags(args, given)
    run = load_input(args.source, _file_config(args) if is_model_file(args.source) else None)
    if args.inspect:
        from tfopt.models.io import load_model
        from tfopt.optimize.inspect import format_report, inspect_model

        print(
            format_report(inspect_model(load_model(run.model_path, trust_model=args.trust_model)))
        )
        return 0
    cfg = resolve_config(args, run.config)
    cli.check_config_flags(cfg, given)
    from tfopt.optimize.runner import run as run_optimize

    settings = [settings_for(args, t) for t in names]
    results = run_optimize(
        args.source,
        cfg,
        settings,
        _outputs(args, names),
        keep_going=len(names) > 1,
        overwrite=args.overwrite,
    )
    records = {}
    for res in results:
        if res.record:
            records[res.technique] = res.record.to_dict()
            _print_result(records[res.technique], res.output)
        elif res.ok:  # a non-chief worker: it writes nothing, but says what it holds
            info = {"technique": res.technique, "weights_sha256": res.weights_sha256}
            print(f"{PROG}: worker done {json.dumps(info)}", flush=True)
        else:
            print(f"{PROG}: {res.technique}: error: {res.error}", file=sys.stderr)
    if args.report and records:
        from tfopt.core.fileio import write_json

        write_json(
            args.report,
            [
                {
                    "technique": r.technique,
                    "output": r.output,
                    "ok": r.ok,
                    **({"error": r.error} if r.error else {}),
                }
                | _summary(records.get(r.technique))
                for r in results
            ],
        )
    if not all(r.ok for r in results):
        return 2
    failed = [f"{r.technique}: {name}" for r in results for name in r.failed_checks]
    if failed:
        print(
            f"{PROG}: check failed: {', '.join(failed)} (see run.json's optimize.checks)",
            file=sys.stderr,
        )
        return 1
    return 0


def _summary(record: dict | None) -> dict:
    if not record:
        return {}
    opt = record["optimize"]
    return {
        "weights_sha256": record["weights_sha256"],
        "test_accuracy": record["metrics"]["test_accuracy"],
        "accuracy_delta": opt["accuracy_delta"],
        "sparsity": opt["sparsity"],
        "clusters": opt["clusters"],
        "gzip_ratio": opt["gzip_ratio"],
        "checks": {k: v["ok"] for k, v in opt["checks"].items()},
        "precision_notes": opt["precision_notes"],
        "strategy": record["strategy"],
        "precision": record["strategy"]["precision"],
    }


def _print_result(record: dict, out: str) -> None:
    with open(os.path.join(out, "layers.txt"), encoding="utf-8") as f:
        print(f.read().rstrip())
    info = {"technique": record["optimize"]["technique"], "output": out, **_summary(record)}
    print(f"{PROG}: done {json.dumps(info)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tfopt.optimize``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    given = flagcheck.explicit(parser, argv)
    return cli.run_main(PROG, lambda: _body(args, given), cli.verbosity(args))
