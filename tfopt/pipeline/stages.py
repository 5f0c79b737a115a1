"""The stages of a pipeline run and what each one is given, derived from a PipelineConfig.

Each stage is a run of a stage of :mod:`tfopt.core.stage` (by name): the RunConfig it runs
under, its inputs and its options, all made here; :mod:`tfopt.pipeline.execute` only hands them
over.

``teacher`` (train) -> ``student`` (distill from the teacher) -> ``student-<technique>``
(optimize, one per compression technique) -> ``<model>-export`` (export every model). Each
stage's fingerprint covers its own inputs and the fingerprints of the stages it reads, so a
changed setting reruns that stage and every stage after it, and nothing else.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from tfopt import config as config_lib
from tfopt.compress.techniques import STRUCTURAL, TECHNIQUES
from tfopt.config import RunConfig
from tfopt.pipeline.config import PipelineConfig
from tfopt.runs import fingerprint, result_config

QAT_TECHNIQUES = tuple(
    name for name, t in TECHNIQUES.items() if t.phases[-1] == "qat"
)  # these convert to int8 only


@dataclass(frozen=True)
class Stage:
    """One stage of a pipeline run.

    Attributes:
        name: Also its run directory under the pipeline run (``teacher``, ``student-pqat-export``).
        kind: The name of the stage it runs (:func:`tfopt.core.stage.get`): ``train``,
            ``distill``, ``optimize`` or ``export``.
        inputs: Names of the stages whose runs it reads.
        settings: Everything that determines its result, as plain data.
        fingerprint: Digest of ``settings`` and of its inputs' fingerprints.
        config: The RunConfig it runs under (its output directory is set when it runs).
        options: The stage's own options (:meth:`tfopt.core.stage.Stage.run`).
    """

    name: str
    kind: str
    inputs: tuple[str, ...]
    settings: dict
    fingerprint: str
    config: RunConfig = dataclasses.field(default_factory=RunConfig, compare=False)
    options: dict = dataclasses.field(default_factory=dict, compare=False)

    @property
    def trains(self) -> bool:
        """True for stages that run a distribution strategy (launched as several processes when needed)."""
        return self.kind in ("train", "distill", "optimize")


def stage_run_config(cfg: PipelineConfig, spec, output_dir: str) -> RunConfig:
    """The RunConfig of one training stage: the pipeline's base with that stage's model (a
    ``TeacherSpec`` or ``StudentSpec``: any model source and its arguments) and schedule."""
    return config_lib.from_dict(
        {
            "model": {"name": spec.model, "args": spec.args},
            "train": {
                "epochs": spec.epochs,
                "learning_rate": spec.learning_rate,
                "output_dir": output_dir,
            },
        },
        cfg.base,
    )


def _result_part(run_cfg: RunConfig, kind: str) -> dict:
    # What the stage's own run fingerprints (tfopt.runs.result_config): the sections it reads,
    # but not a setting that changes where or how a run writes (backups, output, progress).
    out = result_config(run_cfg, kind)
    if kind == "optimize":  # resolved into the run's settings, not its recorded config
        out["optimize"] = dataclasses.asdict(run_cfg.optimize)
    return out


def plan(cfg: PipelineConfig) -> list[Stage]:
    """The stages of ``cfg`` in the order they run (every stage after the ones it reads)."""
    stages: dict[str, Stage] = {}

    def add(name: str, kind: str, inputs: tuple[str, ...], run_cfg: RunConfig, **options) -> None:
        # an export reads its input run's data, so only its own section
        settings = (
            {"export": dataclasses.asdict(run_cfg.export)}
            if kind == "export"
            else {"run": _result_part(run_cfg, kind), **options}
        )
        digest = fingerprint(kind, settings, [stages[i].fingerprint for i in inputs])
        stages[name] = Stage(name, kind, inputs, settings, digest, run_cfg, options)

    t, s, c, e = cfg.teacher, cfg.student, cfg.compress, cfg.export
    student = stage_run_config(cfg, s, "")
    add("teacher", "train", (), stage_run_config(cfg, t, ""))
    distilled = dataclasses.replace(
        student,
        distill=dataclasses.replace(student.distill, temperature=s.temperature, alpha=s.alpha),
    )
    add("student", "distill", ("teacher",), distilled)
    for technique in c.techniques:
        structural = set(STRUCTURAL) & set(TECHNIQUES[technique].phases)
        targets = {"low_rank_flops": c.flops, "channels_flops": c.flops} if structural else {}
        section = dataclasses.replace(
            config_lib.OptimizeConfig(),
            technique=technique,
            sparsity=c.sparsity,
            epochs=c.epochs,
            learning_rate=c.learning_rate,
            **targets,
        )
        add(
            f"student-{technique}",
            "optimize",
            ("student",),
            dataclasses.replace(student, optimize=section),
        )
    for source in ["teacher", "student", *[f"student-{x}" for x in c.techniques]]:
        qat = source.startswith("student-") and source[len("student-") :] in QAT_TECHNIQUES
        export_cfg = config_lib.from_dict({"export": e.overrides(qat)}, cfg.base)
        add(f"{source}-export", "export", (source,), export_cfg)
    return list(stages.values())


def stage_dir(run_dir: str, stage: Stage | str) -> str:
    """The run directory of ``stage`` inside the pipeline run ``run_dir``."""
    return os.path.join(run_dir, stage if isinstance(stage, str) else stage.name)


def replace_output(run_cfg: RunConfig, output_dir: str, verbose: int) -> RunConfig:
    """``run_cfg`` writing to ``output_dir`` with Keras progress ``verbose``."""
    return dataclasses.replace(
        run_cfg, train=dataclasses.replace(run_cfg.train, output_dir=output_dir, verbose=verbose)
    )
