"""Runs one stage of a pipeline through that stage's library entry (never its command line).

In the pipeline's own process for one-process strategies and for exports; for
``multi_worker_mirrored`` and ``parameter_server`` every task that ``tfopt.launch`` starts runs
``python -m tfopt.pipeline.execute RUN STAGE``, which reads the resolved config from the run's
``pipeline.json`` and calls the same entry (the chief writes the stage's run directory).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from tfopt.pipeline import config as pipeline_config
from tfopt.pipeline.config import PipelineConfig
from tfopt.pipeline.stages import Stage, plan, replace_output, stage_dir, stage_run_config

STATE_FILE = "pipeline.json"


def run_stage(
    cfg: PipelineConfig,
    stage: Stage,
    run_dir: str,
    *,
    verbose: int = 1,
) -> None:
    """Runs ``stage`` of the pipeline run ``run_dir`` and commits its run directory.

    Args:
        cfg: The resolved pipeline config.
        stage: The stage (from :func:`tfopt.pipeline.stages.plan`).
        run_dir: The pipeline's run directory.
        verbose: Keras progress of training stages (0, 1 or 2).

    Raises:
        TfoptError: what the stage's entry raises.
    """
    out = stage_dir(run_dir, stage)
    source = stage_dir(run_dir, stage.inputs[0]) if stage.inputs else None
    if stage.kind == "train":
        from tfopt.train.stage import run

        t = cfg.teacher
        run(replace_output(stage_run_config(cfg, t, out), out, verbose), overwrite=True)
    elif stage.kind == "distill":
        from tfopt.distill.stage import run

        s = cfg.student
        run_cfg = replace_output(stage_run_config(cfg, s, out), out, verbose)
        run_cfg = dataclasses.replace(
            run_cfg,
            distill=dataclasses.replace(run_cfg.distill, temperature=s.temperature, alpha=s.alpha),
        )
        run(run_cfg, (source,), overwrite=True)
    elif stage.kind == "optimize":
        from tfopt.compress.channel_prune import ChannelSpec
        from tfopt.compress.low_rank import LowRankSpec
        from tfopt.compress.prune import PruneSpec
        from tfopt.optimize.runner import OptimizeSettings, run

        s, c = cfg.student, cfg.compress
        run_cfg = replace_output(stage_run_config(cfg, s, out), out, verbose)
        settings = OptimizeSettings(
            technique=stage.settings["technique"],
            prune=PruneSpec(sparsity=c.sparsity),
            low_rank=LowRankSpec(flops=c.flops),
            channels=ChannelSpec(flops=c.flops),
            epochs=c.epochs,
            learning_rate=c.learning_rate,
        )
        run(source, run_cfg, [settings], [out], keep_going=False, overwrite=True)
    elif stage.kind == "export":
        from tfopt.export.runner import BenchSettings, ExportSettings, run

        x = stage.settings
        settings = ExportSettings(
            modes=tuple(x["modes"]),
            eval_limit=x["eval_limit"],
            calibration_steps=x["calibration_steps"],
            bench=BenchSettings(threads=tuple(x["threads"]), runs=x["runs"], warmup=x["warmup"]),
        )
        run(source, settings, out, overwrite=True)
    else:  # pragma: no cover - plan() makes only the kinds above
        raise ValueError(f"unknown stage kind {stage.kind!r}")


def read_state(run_dir: str) -> dict | None:
    """The pipeline run's ``pipeline.json`` (None when there is none or it is unreadable)."""
    try:
        with open(os.path.join(run_dir, STATE_FILE), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    """``python -m tfopt.pipeline.execute RUN STAGE``: one task of a launched training stage."""
    from tfopt.cli import run_main

    run_dir, name = (argv if argv is not None else sys.argv[1:])[:2]

    def body() -> int:
        state = read_state(run_dir)
        if state.get("file") and os.path.isfile(
            state["file"]
        ):  # what it registers (e.g. its own models)
            pipeline_config.load_pipeline(state["file"], state.get("variant", "default"))
        cfg = pipeline_config.from_dict(state["config"])
        stage = next(s for s in plan(cfg) if s.name == name)
        run_stage(cfg, stage, run_dir, verbose=int(state.get("verbose", 2)))
        return 0

    return run_main(f"tfopt pipeline[{name}]", body)


if __name__ == "__main__":
    sys.exit(main())
