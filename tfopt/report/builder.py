"""``build``: a pipeline run's report, written atomically into ``<run>/report/``.

    report.md     the report as GitHub-flavoured markdown (images beside it)
    report.html   the same, self-contained: images inlined as base64 data URIs, one file to share
    report.json   everything machine-readable (every figure, the selection, the paths)
    *.png         training curves, Pareto plots
    hparams/      TensorBoard HParams summaries, one run per variant

Nothing is measured again: every figure comes from ``pipeline.json`` and the stages' records,
except the CPU description (read where the report is built) and the TFLite analyzer's op list of
the chosen model (read from its file).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable

from tfopt.core.fileio import atomic_dir, write_bytes, write_json, write_text
from tfopt.core.log import PROGRESS
from tfopt.report import collect as collect_lib
from tfopt.report import debugger, pareto, targets
from tfopt.report.select import choose, parse_rule

log = logging.getLogger(__name__)

REPORT_DIR = "report"
SCHEMA = 1
IMAGES = {"training": "training_curves.png", "pareto": "pareto.png"}
PRIVACY_KEYS = (
    "epsilon_rdp",
    "epsilon_pld",
    "delta",
    "noise_multiplier",
    "l2_clip",
    "steps",
    "sampling",
)


def _stage_rows(run: collect_lib.PipelineRun) -> list[dict]:
    rows = []
    for s in run.stages:
        rec = s.record
        row = s.to_dict()
        if rec is not None:
            train = rec.train or {}
            row.update(
                epochs=train.get("epochs"),
                examples_per_sec=train.get("examples_per_sec"),
                test_accuracy=rec.metrics.get("test_accuracy"),
                model=rec.model.get("name"),
                strategy=(rec.strategy or {}).get("name"),
                replicas=(rec.strategy or {}).get("num_replicas"),
            )
            if train.get("privacy"):  # DP-SGD: what the stage spent
                row["privacy"] = {k: train["privacy"].get(k) for k in PRIVACY_KEYS}
            if train.get("pipeline"):  # --strategy pipeline: the split and what it measured
                row["pipeline"] = train["pipeline"]
        rows.append(row)
    return rows


def build(
    run_dir: str, select: str | None = None, *, progress: Callable[[str], None] | None = None
) -> dict:
    """Builds (or rebuilds) the report of a pipeline run into ``<run_dir>/report/``.

    Args:
        run_dir: The pipeline run directory (``pipeline.json`` + one run directory per stage).
        select: The selection rule (e.g. ``acc_drop<=0.5,p50_us<=50``); None: the one in
            ``pipeline.json`` (and without one, the smallest .tflite of all).

    Returns:
        The content of ``report.json``; ``paths`` holds where the report's files are.

    Raises:
        ConfigError: no pipeline run at ``run_dir``, or a bad rule.
    """
    say = functools.partial(log.log, PROGRESS)
    run_dir = os.path.abspath(run_dir)
    state = collect_lib.read_state(run_dir)
    rule = select if select is not None else state.get("select")
    parse_rule(rule)  # a bad rule fails before anything is read or written
    say(f"reading {run_dir}")
    run = collect_lib.collect(run_dir)
    selection = choose(run.variants, rule)
    chosen = run.variant(selection.chosen) if selection.chosen else None
    fronts = {
        "gzip_bytes": pareto.variant_frontier(run.variants, "gzip_bytes"),
        "p50_us": pareto.variant_frontier(run.variants, "p50_us"),
    }
    b8 = targets.b8(run.variant(run.baseline) if run.baseline else None, chosen)
    curves = collect_lib.training_curves(run)
    from tfopt.report import content, environment, hparams, plots, render

    env = environment.environment(run)
    analyzer = None
    if chosen and chosen.file and os.path.isfile(chosen.file):
        say(f"analyzing {chosen.name} with the TFLite model analyzer")
        analyzer = environment.analyze_tflite(chosen.file)
    final = os.path.join(run_dir, REPORT_DIR)
    report = _content(run, state, selection, fronts, b8, curves, env, analyzer, final)
    paths = report["paths"]
    say("drawing the figures")
    images = {
        "training": plots.training_curves(curves),
        "pareto": plots.pareto(
            run.variants, fronts["gzip_bytes"], fronts["p50_us"], selection.chosen
        ),
    }
    with atomic_dir(final) as tmp:
        for key, png in images.items():
            if png is not None:
                write_bytes(os.path.join(tmp, IMAGES[key]), png)
                paths["images"][key] = os.path.join(final, IMAGES[key])
        say("writing the TensorBoard HParams summaries")
        report["hparams"]["runs"] = hparams.write(
            os.path.join(tmp, "hparams"), run.variants, selection.chosen
        )
        blocks = content.blocks(report)
        write_text(os.path.join(tmp, "report.md"), render.markdown(blocks))
        write_text(
            os.path.join(tmp, "report.html"),
            render.html(blocks, {k: v for k, v in images.items() if v}),
        )
        write_json(os.path.join(tmp, "report.json"), report)
    return report


def _content(run, state: dict, selection, fronts, b8, curves, env, analyzer, final: str) -> dict:
    """The content of ``report.json`` (its figures and HParams runs are added as they are written)."""
    paths = {
        "dir": final,
        "md": os.path.join(final, "report.md"),
        "html": os.path.join(final, "report.html"),
        "json": os.path.join(final, "report.json"),
        "hparams": os.path.join(final, "hparams"),
        "images": {},
    }
    report = {
        "schema": SCHEMA,
        "pipeline": state.get("pipeline"),
        "variant": state.get("variant"),
        "run_dir": run.path,
        "pipeline_file": state.get("file"),
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "summary": {
            "chosen": selection.chosen,
            "statement": selection.statement,
            "rule": selection.rule,
            "b8_passed": b8["passed"],
        },
        "environment": env,
        "config": state.get("config"),
        "strategy": state.get("strategy"),
        "stages": _stage_rows(run),
        "wall_seconds": state.get("wall_seconds"),
        "probe": state.get("probe"),
        "training": curves,
        "baseline": run.baseline,
        "variants": [v.to_dict() for v in run.variants],
        "pareto": fronts,
        "selection": selection.to_dict(),
        "b8": b8,
        "quantization_debugger": debugger.findings(run),
        "analyzer": analyzer,
        "cpu_peaks": next(
            (
                s.record.section.get("cpu_peaks")
                for s in run.stages
                if s.kind == "export" and s.record and s.record.section.get("cpu_peaks")
            ),
            None,
        ),
        "hparams": {"dir": paths["hparams"], "runs": []},
        "warnings": list(run.warnings),
        "paths": paths,
    }
    return report
