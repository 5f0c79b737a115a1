"""Runs one stage of a pipeline through the stage registry (:mod:`tfopt.core.stage`), never a
stage's module or command line.

In the pipeline's own process for one-process strategies and for exports; for
``multi_worker_mirrored`` and ``parameter_server`` every task that ``tfopt.launch`` starts runs
``python -m tfopt.pipeline.execute RUN STAGE``, which reads the resolved config from the run's
``pipeline.json`` and calls the same entry (the chief writes the stage's run directory).
"""

from __future__ import annotations

import json
import os
import sys

from tfopt.core.stage import get
from tfopt.pipeline import config as pipeline_config
from tfopt.pipeline.stages import Stage, plan, replace_output, stage_dir

STATE_FILE = "pipeline.json"


def run_stage(stage: Stage, run_dir: str, *, verbose: int = 1) -> None:
    """Runs ``stage`` of the pipeline run ``run_dir`` and commits its run directory.

    Args:
        stage: The stage (from :func:`tfopt.pipeline.stages.plan`).
        run_dir: The pipeline's run directory.
        verbose: Keras progress of training stages (0, 1 or 2).

    Raises:
        TfoptError: what the stage raises.
    """
    out = stage_dir(run_dir, stage)
    inputs = [stage_dir(run_dir, name) for name in stage.inputs]
    get(stage.kind).run(
        replace_output(stage.config, out, verbose),
        inputs,
        out,
        options=stage.options,
        overwrite=True,
    )


def read_state(run_dir: str) -> dict | None:
    """The pipeline run's ``pipeline.json`` (None when there is none or it is unreadable)."""
    try:
        with open(os.path.join(run_dir, STATE_FILE), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    """``python -m tfopt.pipeline.execute RUN STAGE``: one task of a launched training stage."""
    from tfopt.config.cli import run_main

    run_dir, name = (argv if argv is not None else sys.argv[1:])[:2]

    def body() -> int:
        state = read_state(run_dir)
        if state.get("file") and os.path.isfile(
            state["file"]
        ):  # what it registers (e.g. its own models)
            pipeline_config.load_pipeline(state["file"], state.get("variant", "default"))
        cfg = pipeline_config.from_dict(state["config"])
        stage = next(s for s in plan(cfg) if s.name == name)
        run_stage(stage, run_dir, verbose=int(state.get("verbose", 2)))
        return 0

    return run_main(f"tfopt pipeline[{name}]", body)


if __name__ == "__main__":
    sys.exit(main())
