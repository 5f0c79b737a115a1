"""Helper program for tests/test_optimize_matrix.py: the in-process cells of the matrix.

    python tests/optimize_matrix_cells.py RUN_DIR OUT_DIR REPORT.json CELLS [FLAGS...]

CELLS is a comma-separated list of ``STRATEGY/PRECISION`` (every technique) or
``STRATEGY/PRECISION=TECH+TECH`` (those techniques). Each group runs in this one process (one_device
and mirrored can share a process; the precision policy is set per job) through the same code path
as ``python -m tfopt.optimize`` (its flag parser, one ``run_optimize`` job per group); one JSON
row per cell is written.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tfopt.runtime.devices import setup_cpu_replicas  # noqa: E402

setup_cpu_replicas(2)  # mirrored: 2 replicas on the one CPU, before TensorFlow touches devices

from tfopt.core.fileio import write_json  # noqa: E402
from tfopt.optimize.cli import build_parser, resolve_config  # noqa: E402
from tfopt.optimize.runner import run as run_optimize  # noqa: E402
from tfopt.optimize.settings import settings_for  # noqa: E402
from tfopt.runs import load_run  # noqa: E402

TECHNIQUES = "prune,prune_2of4,qat,cluster,pqat,cqat,pcqat,low_rank,low_rank_qat,channel_prune,channel_prune_qat"


def main(run_dir: str, out_dir: str, report: str, cells: str, *flags: str) -> None:
    run = load_run(run_dir)
    rows = []
    for cell in cells.split(","):
        pair, _, techs = cell.partition("=")
        strategy, precision = pair.split("/")
        argv = [
            "--from",
            run_dir,
            "--technique",
            techs.replace("+", ",") or TECHNIQUES,
            "--strategy",
            strategy,
            "--precision",
            precision,
            "--quiet",
            "--no-saved-model",
            "--no-tensorboard",
            *flags,
        ]
        args = build_parser().parse_args(argv)
        cfg = resolve_config(args, run.config)
        names = args.technique.split(",")
        settings = [settings_for(cfg.optimize, name) for name in names]
        outs = [os.path.join(out_dir, f"{strategy}-{precision}", name) for name in names]
        started = time.process_time()
        for res in run_optimize(run_dir, cfg, settings, outs, keep_going=True):
            rows.append({"strategy": strategy, "precision": precision, **_row(res)})
        print(
            f"cells {strategy} {precision}: {time.process_time() - started:.1f} s CPU", flush=True
        )
    write_json(report, rows)


def _row(res) -> dict:
    out = {"technique": res.technique, "ok": res.ok, "error": res.error or ""}
    rec = res.record.to_dict() if res.record else None
    if rec:
        opt = rec["optimize"]
        out.update(
            test_accuracy=rec["metrics"]["test_accuracy"],
            source_accuracy=opt["source"]["test_accuracy"],
            sparsity=opt["sparsity"],
            clusters=opt["clusters"],
            notes=opt["precision_notes"],
            checks={k: v["ok"] for k, v in opt["checks"].items()},
            replicas=rec["strategy"]["num_replicas"],
        )
    return out


if __name__ == "__main__":
    main(*sys.argv[1:])
