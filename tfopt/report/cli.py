"""``python -m tfopt.report``: (re)build the report of a finished pipeline run.

    python -m tfopt.report runs/mnist_edge
    python -m tfopt.report runs/mnist_edge --select 'acc_drop<=0.5,p50_us<=50'

Writes ``<RUN>/report/`` (report.md, report.html, report.json, the figures, hparams/) and prints
where. Exit codes: 0 done; 2 a user error (no such run, no pipeline.json, a bad rule: one line
on stderr).
"""

from __future__ import annotations

import sys

from tfopt.config import cli

PROG = "tfopt report"


def _parser() -> cli.ArgumentParser:
    from tfopt.report.select import EXAMPLE, KEYS, OPS

    p = cli.ArgumentParser(
        prog=PROG,
        description=__doc__.splitlines()[0],
        epilog="exit codes: 0 done, 2 user error",
    )
    p.add_argument(
        "run", metavar="RUN", help="a pipeline run directory (the -o of python -m tfopt.pipeline)"
    )
    p.add_argument(
        "--select",
        metavar="RULE",
        help=f"choose the edge model by this rule instead of the pipeline's, e.g. '{EXAMPLE}' "
        f"(keys: {', '.join(KEYS)}; operators: {' '.join(OPS)}; objective min:KEY or max:KEY, "
        "default min:gzip_kb: the best of the variants that satisfy every constraint wins)",
    )
    cli.add_verbosity(p, "no progress lines")
    return p


def _start_tensorflow() -> None:
    """Starts TensorFlow's runtime where its start-up notices (the CUDA probe) are filtered out."""
    from tfopt.core._keras import tf

    from tfopt.core import native_stderr

    with native_stderr.filtered():
        tf.config.list_physical_devices()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point of ``python -m tfopt.report``; returns the exit code."""
    args = _parser().parse_args(argv)

    def body() -> int:
        from tfopt.report.builder import build
        from tfopt.report.collect import read_state
        from tfopt.report.select import parse_rule

        # Mistakes fail before the report's heavier imports (TensorFlow, matplotlib).
        state = read_state(args.run)
        parse_rule(args.select if args.select is not None else state.get("select"))
        _start_tensorflow()
        report = build(args.run, args.select)
        sel = report["selection"]
        print(sel["statement"])
        for problem in report["b8"].get("trouble") or []:
            print(f"{PROG}: not ready to ship: {problem}")
        for row in report["b8"]["rows"]:
            value = "-" if row["value"] is None else f"{row['value']:.2f} {row['unit']}"
            print(f"{row['name']}: {value} (target {row['target']}): {row['status']}")
        chosen = next((v for v in report["variants"] if v["name"] == sel["chosen"]), None)
        if chosen and chosen.get("file"):
            print(f"ship: {chosen['file']}")
        paths = report["paths"]
        print(f"{PROG}: wrote {paths['html']}")
        print(f"{PROG}: wrote {paths['md']}")
        print(f"{PROG}: wrote {paths['json']}")
        return 0

    return cli.run_main(PROG, body, cli.verbosity(args))


if __name__ == "__main__":
    sys.exit(main())
