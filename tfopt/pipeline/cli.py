"""``python -m tfopt.pipeline PIPELINE.py``: data to a verified edge model and its report, in one command."""

from __future__ import annotations

import argparse
import json
import os
import sys

from tfopt.config import cli

PROG = "tfopt pipeline"


def build_parser() -> cli.ArgumentParser:
    """The command line of ``python -m tfopt.pipeline``."""
    parser = cli.ArgumentParser(
        prog=PROG,
        description="Run a pipeline end to end: train a teacher, distil a student, compress it, export "
        "every model to TFLite, evaluate and benchmark every variant, and write the report. A re-run resumes at "
        "the first unfinished stage; a changed setting reruns that stage and the ones after it.",
    )
    parser.add_argument(
        "pipeline",
        help="a pipeline file (e.g. pipelines/mnist_edge.py, defining get_config(variant)) or the "
        "name of an example tfopt ships: mnist_edge, fashion_edge, folder_edge",
    )
    parser.add_argument(
        "--variant", default="default", help="the pipeline's variant (e.g. smoke; default: default)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a setting: data.limit=2048, teacher.epochs=1, compress.techniques=pqat,"
        "prune_2of4, export.modes=float32,int8 ... (repeatable)",
    )
    parser.add_argument(
        "--strategy", help="the strategy of every training stage (= --set runtime.strategy=...)"
    )
    parser.add_argument(
        "--select",
        metavar="RULE",
        help="how the edge model is chosen, e.g. 'acc_drop<=0.5,p50_us<=50' (keys: acc, acc_drop, "
        "agreement, size_kb, gzip_kb, p50_us, p95_us, p50_us_2t, params)",
    )
    parser.add_argument(
        "--output", "-o", help="the pipeline run directory (default runs/<name>[-<variant>])"
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config as JSON and exit"
    )
    parser.add_argument(
        "--no-report",
        action="store_true",
        help="skip the report (build it later: python -m tfopt.report RUN)",
    )
    cli.add_verbosity(parser, "no progress lines, no Keras progress inside the stages")
    parser.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="multi-process stages in a private network namespace, off the network: by default "
        "where the kernel allows it; --isolate: always, or fail; --no-isolate: never "
        "(= --set launch.isolate=on|off)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tfopt.pipeline``."""
    args = build_parser().parse_args(argv)

    def body() -> int:
        from tfopt.pipeline.config import apply_overrides, find_pipeline, load_pipeline

        file = find_pipeline(args.pipeline)
        cfg = load_pipeline(file, args.variant)
        overrides = list(args.set)
        if args.strategy:
            overrides.append(f"runtime.strategy={args.strategy}")
        if args.select:
            overrides.append(f"select={args.select}")
        if args.isolate is not None:
            overrides.append(f"launch.isolate={'on' if args.isolate else 'off'}")
        cfg = apply_overrides(cfg, overrides)
        if args.print_config:
            print(json.dumps(cfg.to_dict(), indent=2))
            return 0
        run_dir = args.output or os.path.join(
            "runs", cfg.name + ("" if args.variant == "default" else f"-{args.variant}")
        )
        from tfopt.pipeline.runner import run_pipeline

        state = run_pipeline(
            cfg,
            run_dir,
            variant=args.variant,
            file=file,
            verbose=0 if args.quiet else 1,
            report=not args.no_report,
        )
        report = state.get("report") or {}
        print(
            f"{PROG}: {cfg.name} finished in {state['wall_seconds']:.0f} s: {os.path.abspath(run_dir)}"
        )
        if report.get("paths"):
            print(f"{PROG}: report: {report['paths'].get('html')}")
        return 0

    return cli.run_main(PROG, body, cli.verbosity(args))


if __name__ == "__main__":
    sys.exit(main())
