"""``python -m tfopt.optimize``: prune, quantize-aware train or cluster a trained run.

    python -m tfopt.optimize --from runs/mnist --technique prune --sparsity 0.8 --strategy mirrored
    python -m tfopt.optimize --from runs/mnist --technique prune_2of4
    python -m tfopt.optimize --from runs/mnist --technique pqat --precision mixed_bfloat16
    python -m tfopt.optimize --from runs/mnist --inspect
    python -m tfopt.launch --workers 2 -- python -m tfopt.optimize --from runs/mnist --technique qat \\
        --strategy multi_worker_mirrored
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from tfopt import config as config_lib
from tfopt.compress.techniques import TECHNIQUES
from tfopt.config import cli
from tfopt.core import flagcheck
from tfopt.core.errors import ConfigError
from tfopt.runs import is_model_file

PROG = "tfopt optimize"
TECHNIQUE_NAMES = tuple(TECHNIQUES)
#: The config sections tfopt optimize reads whole (the run's data, model and training settings
#: come from the input run; these fields of them may be changed for the fine-tuning).
SECTIONS = ("optimize",)
SHARED = (
    "data.dataset",
    "data.data_dir",
    "data.image_size",
    "data.channels",
    "data.global_batch_size",
    "data.limit",
    "model.trust",
    "runtime.strategy",
    "runtime.precision",
    "runtime.cpu_replicas",
    "runtime.collective",
    "runtime.deterministic",
    "train.backup_every",
)
#: The data flags a model file needs and a run directory brings its own values of.
FILE_DATA = ("--dataset", "--image-size", "--channels")


def _reads(technique: str) -> set[str]:
    """The phases (``Flag.read_by`` of the optimize fields) a technique reads."""
    t = TECHNIQUES[technique]
    return set(t.phases) | ({"magnitude"} if "prune" in t.phases and t.m_by_n is None else set())


#: flag -> the techniques that use it, from the optimize fields' read_by over the registry.
FLAG_USERS = {
    flag.name: tuple(t for t in TECHNIQUE_NAMES if set(flag.read_by) & _reads(t))
    for _, _, flag in cli.config_flags(SECTIONS)
    if flag.read_by
}


def build_parser() -> cli.ArgumentParser:
    """The argument parser, generated from the ``optimize`` section and the shared fields it
    reads (no TensorFlow import: ``--help`` stays fast)."""
    p = cli.ArgumentParser(
        prog=PROG,
        description=__doc__.splitlines()[0],
        epilog="techniques: "
        + ", ".join(TECHNIQUE_NAMES)
        + "; exit codes: 0 done, 1 a sparsity/cluster/2:4 check failed, 2 user error",
    )
    g = p.add_argument_group("inputs")
    g.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="RUN|MODEL",
        help="the trained run to optimize, or a model file (.keras, .h5, a SavedModel directory) "
        "with --dataset",
    )
    g.add_argument("--inspect", action="store_true", help="list what each layer supports and exit")
    g.add_argument(
        "--output",
        "-o",
        help="new run directory (default <from>-<technique>); with several "
        "techniques, a parent directory holding one run per technique",
    )
    g.add_argument(
        "--report", metavar="FILE", help="also write a JSON list of each technique's outcome"
    )
    cli.add_config_args(p, SECTIONS, shared=SHARED, inherited="the input run's")
    return p


def resolve_config(args, base: config_lib.RunConfig) -> config_lib.RunConfig:
    """The input run's config (its ``optimize`` section reset), then ``--config``, ``--set`` and
    the flags."""
    base = dataclasses.replace(base, optimize=config_lib.OptimizeConfig())
    cfg = cli.config_from_args(args, base)
    return config_lib.from_dict({"train": {"verbose": 0 if args.quiet else 1}}, cfg)


def _outputs(args, techniques: tuple[str, ...]) -> list[str | None]:
    if not args.output:
        return [None] * len(techniques)
    if len(techniques) == 1:
        return [args.output]
    return [os.path.join(args.output, t) for t in techniques]


def check_flags(args, given: set[str], cfg: config_lib.RunConfig | None = None) -> tuple[str, ...]:
    """Validates the technique names and refuses a technique flag none of them uses.

    Args:
        args: The parsed command line.
        given: The options given explicitly (:func:`tfopt.core.flagcheck.explicit`).
        cfg: The resolved config (default: resolved from ``args`` over the defaults).

    Returns:
        The technique names (empty with ``--inspect``, which uses no technique flag).

    Raises:
        ConfigError: an unknown technique, or e.g. ``--sparsity`` with ``channel_prune``.
    """
    o = (cfg or resolve_config(args, config_lib.RunConfig())).optimize
    names = o.techniques()
    if args.inspect and names:
        raise ConfigError("--inspect lists the layers and trains nothing; drop --technique")
    if not args.inspect and not names:
        raise ConfigError(
            f"no technique given; give --technique with one of {', '.join(TECHNIQUE_NAMES)}, "
            "or --inspect"
        )
    for name in names:
        if name not in TECHNIQUE_NAMES:
            raise ConfigError(
                f"technique {name!r} is not valid; choose one of {', '.join(TECHNIQUE_NAMES)}"
            )
    chosen = names or ("--inspect",)
    flagcheck.refuse_unused(
        FLAG_USERS, chosen, given, chosen_as=",".join(chosen), fix=lambda *_: _takes(chosen)
    )
    flagcheck.refuse_off(_read_by_value(o), given)
    if not is_model_file(args.source):
        run = "--from RUN (a run brings its own data)"
        flagcheck.refuse_off({f: (False, run, "--from MODEL_FILE", None) for f in FILE_DATA}, given)
    return names


def _read_by_value(o: config_lib.OptimizeConfig) -> dict[str, tuple[bool, str, str, str | None]]:
    """The technique flags read only for some values of another (see flagcheck.refuse_off)."""
    target = (
        f"--channels-ratio {o.channels_ratio:g}"
        if o.channels_ratio
        else f"--target-latency-us {o.target_latency_us:g}"
    )
    return {
        "--taylor-batches": (
            o.importance == "taylor",
            f"--importance {o.importance}",
            "--importance taylor",
            None,
        ),
        "--latency-threads": (
            bool(o.target_latency_us),
            "no --target-latency-us",
            "--target-latency-us US",
            None,
        ),
        "--channels-flops": (
            not (o.channels_ratio or o.target_latency_us),
            target,
            "no other channel target",
            f"give one target: --channels-flops or {target.split()[0]}",
        ),
        "--initial-sparsity": (
            o.schedule != "constant",
            "--schedule constant",
            "--schedule polynomial",
            None,
        ),
        "--low-rank-flops": (
            o.low_rank_by == "flops",
            f"--low-rank-by {o.low_rank_by}",
            "--low-rank-by flops",
            None,
        ),
        "--low-rank-energy": (
            o.low_rank_by == "energy",
            f"--low-rank-by {o.low_rank_by}",
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
    from tfopt.runs import load_input

    names = check_flags(args, given)
    file_cfg = cli.config_from_args(args) if is_model_file(args.source) else None
    run = load_input(args.source, file_cfg)
    cfg = resolve_config(args, run.config)
    if args.inspect:
        from tfopt.models.io import load_model
        from tfopt.optimize.inspect import format_report, inspect_model

        model = load_model(run.model_path, trust_model=cfg.model.trust)
        print(format_report(inspect_model(model)))
        return 0
    cli.check_config_flags(cfg, given)
    if args.print_config:
        shown = {**cfg.to_dict("optimize"), "optimize": dataclasses.asdict(cfg.optimize)}
        print(json.dumps(shown, indent=2))
        return 0
    from tfopt.optimize.runner import run as run_optimize
    from tfopt.optimize.settings import settings_for

    settings = [settings_for(cfg.optimize, t, cfg.model.trust) for t in names]
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
