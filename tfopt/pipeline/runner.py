"""The end-to-end runner: every stage of a pipeline in order, resumable at the first unfinished one.

A pipeline run directory holds ``pipeline.json`` (the resolved config and each stage's state),
one run directory per stage (see :mod:`tfopt.pipeline.stages`) and ``report/``. A stage is
finished when its run is committed and the fingerprint it was made with still matches; a re-run
skips finished stages and reruns the first unfinished one (its own backups resume it mid-way)
and every stage after a rerun one that reads it. Training stages of ``multi_worker_mirrored``
and ``parameter_server`` run as ``tfopt.launch`` process groups, with restarts.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from tfopt.core.children import run_child
from tfopt.core.errors import ConfigError, TfoptError
from tfopt.core.fileio import write_json
from tfopt.pipeline.config import MULTI_PROCESS, PipelineConfig
from tfopt.pipeline.execute import STATE_FILE, read_state, run_stage
from tfopt.pipeline.stages import Stage, plan, stage_dir

log = logging.getLogger(__name__)

SCHEMA = 1


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = round(width * done / total) if total else width
    return "[" + "#" * filled + "-" * (width - filled) + f"] {done}/{total}"


def _finished(stage: Stage, run_dir: str, previous: dict) -> bool:
    old = previous.get(stage.name, {})
    return (
        old.get("status") == "done"
        and old.get("fingerprint") == stage.fingerprint
        and os.path.isfile(os.path.join(stage_dir(run_dir, stage), "run.json"))
    )


def launch_command(cfg: PipelineConfig, stage: Stage, run_dir: str) -> list[str]:
    """The ``tfopt.launch`` command that runs a training stage as a process group (one entry for every task)."""
    launch = cfg.launch
    cmd = [
        sys.executable,
        "-m",
        "tfopt.launch",
        "--workers",
        str(launch.workers),
        "--max-restarts",
        str(launch.max_restarts),
    ]
    if cfg.base.runtime.strategy == "parameter_server":
        cmd += ["--chief", "--ps", str(launch.ps)]
    cmd += {"auto": [], "on": ["--isolate"], "off": ["--no-isolate"]}[launch.isolate]
    return [*cmd, "--", sys.executable, "-m", "tfopt.pipeline.execute", run_dir, stage.name]


def _launch(cfg: PipelineConfig, stage: Stage, run_dir: str) -> None:
    """Runs a training stage under ``tfopt.launch``; raises TfoptError when it fails."""
    code = run_child(launch_command(cfg, stage, run_dir))
    if code != 0 or not os.path.isfile(os.path.join(stage_dir(run_dir, stage), "run.json")):
        raise TfoptError(
            f"stage {stage.name!r} ({stage.kind}) failed under tfopt.launch (exit {code}); its tasks' "
            "output is above; run the pipeline again to resume from the stage's last backup"
        )


def check_run_dir(cfg: PipelineConfig, run_dir: str) -> dict:
    """Refuses a run directory that is not this pipeline's; returns its previous state (or {}).

    Raises:
        ConfigError: ``run_dir`` is a file, a non-empty directory without ``pipeline.json``, or
            the run of another pipeline.
    """
    if os.path.isfile(run_dir):
        raise ConfigError(f"-o {run_dir!r} is a file; give a directory")
    state = read_state(run_dir)
    if state is None:
        if os.path.isdir(run_dir) and os.listdir(run_dir):
            raise ConfigError(
                f"-o {run_dir!r} is a non-empty directory without {STATE_FILE}; give a new directory "
                "or the run directory of this pipeline"
            )
        return {}
    if state.get("pipeline") != cfg.name:
        raise ConfigError(
            f"-o {run_dir!r} holds a run of pipeline {state.get('pipeline')!r}, not {cfg.name!r}; "
            "give another -o"
        )
    return state


def run_pipeline(
    cfg: PipelineConfig,
    run_dir: str,
    *,
    variant: str = "default",
    file: str = "",
    verbose: int = 1,
    report: bool = True,
) -> dict:
    """Runs (or resumes) a pipeline into ``run_dir`` and builds its report.

    Args:
        cfg: The validated pipeline config.
        run_dir: The pipeline run directory (created; a previous run of the same pipeline resumes).
        variant: The variant name ``cfg`` was made for (recorded).
        file: The pipeline file (recorded).
        verbose: Keras progress inside training stages (0 silent, 1 bar, 2 one line per epoch).
        report: Build ``report/`` at the end.

    Returns:
        The content of ``pipeline.json`` (plus ``report``: the report's summary when built).

    Raises:
        TfoptError: a bad run directory, or a stage's error (the finished stages stay finished).
    """
    say = log.info  # a stage starting or kept: an event (--quiet keeps it)
    run_dir = os.path.abspath(run_dir)
    old_state = check_run_dir(cfg, run_dir)
    previous = {s["name"]: s for s in old_state.get("stages", [])}
    os.makedirs(run_dir, exist_ok=True)
    stages = plan(cfg)
    multi = cfg.base.runtime.strategy in MULTI_PROCESS
    state = _initial_state(cfg, stages, variant, file, 2 if multi else verbose)
    entries = {e["name"]: e for e in state["stages"]}
    for stage in stages:  # a kill mid-run must not lose the marks of stages that stay valid
        if _finished(stage, run_dir, previous):
            entries[stage.name].update(status="done", seconds=previous[stage.name].get("seconds"))
    rerun: set[str] = set()
    started = time.perf_counter()
    for i, stage in enumerate(stages):
        entry = entries[stage.name]
        head = f"pipeline {cfg.name} {_bar(i, len(stages))} {stage.name} ({stage.kind})"
        if _finished(stage, run_dir, previous) and not rerun.intersection(stage.inputs):
            entry.update(status="done", seconds=previous[stage.name].get("seconds"))
            say(f"{head}: finished earlier with the same settings, kept")
            continue
        say(f"{head}: running")
        stale = {stage.name}
        for later in stages[i:]:  # this stage and every stage built on it, directly or not
            if later.name in stale or stale.intersection(later.inputs):
                stale.add(later.name)
                entries[later.name].update(status="pending", seconds=None)
        write_json(os.path.join(run_dir, STATE_FILE), state)
        t0 = time.perf_counter()
        if multi and stage.trains:
            _launch(cfg, stage, run_dir)
        else:
            run_stage(stage, run_dir, verbose=verbose)
        entry.update(status="done", seconds=round(time.perf_counter() - t0, 1))
        rerun.add(stage.name)
        write_json(os.path.join(run_dir, STATE_FILE), state)
    say(f"pipeline {cfg.name} {_bar(len(stages), len(stages))} every stage finished")
    if cfg.probe.steps:
        old = old_state.get("probe")
        state["probe"] = (
            old
            if old and not rerun and old.get("steps") == cfg.probe.steps
            else _probe(cfg, run_dir, say)
        )
    state["wall_seconds"] = round(time.perf_counter() - started, 1)
    write_json(os.path.join(run_dir, STATE_FILE), state)
    if report:
        from tfopt.report import build

        say(f"pipeline {cfg.name}: writing the report")
        state["report"] = build(run_dir, cfg.select)
    return state


def _initial_state(
    cfg: PipelineConfig, stages: list[Stage], variant: str, file: str, verbose: int
) -> dict:
    """The content of ``pipeline.json`` before any stage runs (every stage pending)."""
    return {
        "schema": SCHEMA,
        "pipeline": cfg.name,
        "variant": variant,
        "file": os.path.abspath(file) if file else "",
        "config": cfg.to_dict(),
        "select": cfg.select,
        "strategy": cfg.base.runtime.strategy,
        "verbose": verbose,
        "stages": [
            {
                "name": s.name,
                "kind": s.kind,
                "dir": s.name,
                "inputs": list(s.inputs),
                "fingerprint": s.fingerprint,
                "status": "pending",
                "seconds": None,
            }
            for s in stages
        ],
    }


def _probe(cfg: PipelineConfig, run_dir: str, say) -> dict:
    from tfopt.pipeline.probe import measure

    say(f"pipeline {cfg.name}: measuring the input pipeline against the teacher's training step")
    return measure(cfg.base, stage_dir(run_dir, "teacher"), steps=cfg.probe.steps)
