"""Benchmark B8 (end to end): the teacher as a float Keras model vs the edge model ``mnist_edge`` picks.

    PYTHONPATH=. python bench/end_to_end.py                 # runs pipelines/mnist_edge.py (~15 min, 2 cores)
    PYTHONPATH=. python bench/end_to_end.py --run runs/mnist_edge   # reads a finished pipeline run
    PYTHONPATH=. python bench/end_to_end.py --smoke         # the smoke variant (tests)

The figures are the pipeline report's (``report.json`` ``b8``): size = the teacher's float32
weight bytes / the chosen .tflite file's bytes; latency = the teacher's Keras p50 (one example
per call in a ``tf.function``, 1 intra-op thread, its own process) / the chosen .tflite's LiteRT
p50 (XNNPACK, 1 thread); accuracy = the teacher's test accuracy - the chosen model's, on the whole
test split. The pipeline, its selection rule and every training setting are the published ones:
nothing is tuned here. Writes ``bench/results/end_to_end.json`` with the CPU's lscpu flags.
"""

import os
import sys
import time

if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import (  # noqa: E402
    environment_light,
    figure,
    lscpu_info,
    markdown_table,
    publish,
    script_parser,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPELINE = os.path.join(REPO, "pipelines", "mnist_edge.py")
TARGETS = {
    "size": ">= 20x smaller",
    "latency": ">= 10x faster (1 thread)",
    "accuracy": "<= 0.5 pt lost",
}
ANCHOR = {"size": "tfmot combined (prune + cluster + QAT): ~10x"}


def figures(b8: dict) -> list[dict]:
    """The three B8 rows of the pipeline's report as ``bench/_common.figure`` dicts (one run each)."""
    out = []
    for row in b8["rows"]:
        key = row["name"].split(":")[0].split()[0]
        op, bound = row["target"].split()[:2]
        out.append(
            figure(
                row["name"],
                [row["value"]],
                row["unit"],
                target=(op, float(bound.rstrip("x"))),
                anchor=ANCHOR.get(key),
                detail=row["detail"],
            )
        )
    return out


def _args(argv):
    p = script_parser(
        __doc__,
        "end_to_end",
        "the pipeline's smoke variant (checks the script runs)",
        workdir="runs/bench-end_to_end",
        workdir_help="where the pipeline runs (default %(default)s)",
    )
    p.add_argument(
        "--run", help="a finished mnist_edge pipeline run to read (default: run the pipeline)"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Runs (or reads) the pipeline, prints the B8 table and writes the JSON result."""
    args = _args(argv)
    started = time.perf_counter()
    variant = "smoke" if args.smoke else "default"
    run_dir = args.run
    if run_dir is None:
        from tfopt.pipeline import load_pipeline, run_pipeline

        run_dir = args.workdir + ("-smoke" if args.smoke else "")
        run_pipeline(
            load_pipeline(PIPELINE, variant), run_dir, variant=variant, file=PIPELINE, verbose=2
        )
    from tfopt.report import build

    report = build(run_dir)
    b8, variants = report["b8"], {v["name"]: v for v in report["variants"]}
    teacher, chosen = variants.get(b8["teacher"]), variants.get(b8["chosen"] or "")
    rows = [
        [
            r["name"],
            "-" if r["value"] is None else f"{r['value']:.2f} {r['unit']}",
            r["target"],
            r["status"],
            r["detail"],
        ]
        for r in b8["rows"]
    ]
    print(
        f"B8 end to end: {b8['teacher']} vs {b8['chosen']} (rule {report['selection']['rule']!r}), {run_dir}"
    )
    print(markdown_table(["figure", "measured", "target", "status", "detail"], rows))
    result = {
        "id": "B8",
        "title": "end to end",
        "command": "PYTHONPATH=. python bench/end_to_end.py",
        "figures": figures(b8),
        "benchmark": "B8 end to end",
        "variant": variant,
        "run_dir": os.path.abspath(run_dir),
        "pipeline": report["pipeline"],
        "rule": report["selection"]["rule"],
        "teacher": teacher,
        "chosen": chosen,
        "b8": b8,
        "stages": report["stages"],
        "pipeline_wall_seconds": report.get("wall_seconds"),
        "environment": environment_light(),
        "lscpu": lscpu_info(),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "params": {"smoke": args.smoke},
    }
    return publish(result, args.out, "B8")


if __name__ == "__main__":
    sys.exit(main())
