"""Run directories: the one ``run.json`` schema every stage writes, and where runs go.

Every stage (train, distill, optimize, export) writes a NEW run directory holding ``run.json``,
a :class:`RunRecord`: config, versions, strategy, data, model, train (timings, throughput),
the complete per-epoch history, metrics, artifacts, plus one section named after the stage
(``distill``, ``optimize``, ``export``) with what only that stage knows. Later stages start
from a run directory with :func:`load_run`.

Default output directories never replace a run: ``runs/train``, then ``runs/train-2``, ... and
``runs/latest`` is a symlink to the newest run committed under ``runs/``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from tfopt import config as config_lib
from tfopt.core import runlock
from tfopt.core.errors import ConfigError
from tfopt.core.fileio import tree_digest
from tfopt.core.specs import STAGES

__all__ = [
    "PARTIAL_SUFFIX",
    "Run",
    "RunRecord",
    "is_model_file",
    "load_input",
    "load_run",
    "update_latest",
]
SCHEMA_VERSION = 2
RUNS_ROOT = "runs"
LATEST = "latest"
PARTIAL_SUFFIX = ".partial"  # an unfinished run's work directory, beside its final place


@dataclass
class RunRecord:
    """The content of a stage's ``run.json``.

    Attributes:
        stage: ``train``, ``distill``, ``optimize`` or ``export``.
        config: The resolved :class:`~tfopt.config.RunConfig` as plain dicts.
        versions: tfopt, Python and the TensorFlow stack.
        strategy: Strategy name, class, replicas, workers.
        data: Dataset name, image shape, classes, records per split.
        model: Model name and parameter count (and what the stage adds).
        train: Epochs, steps, batch sizes, learning rate, seconds, examples/s.
        history: One row per epoch over the whole run (resumes included).
        metrics: Held-out test metrics (``test_accuracy``, ...).
        artifacts: Name -> path relative to the run directory.
        section: The stage-specific section, stored under the stage's name.
        weights_sha256: Digest of the saved model's weights.
        fingerprint: Digest of everything that determines the result (config + stage options).
        warnings: One line each: what makes the result doubtful (e.g. a test accuracy at chance,
            :mod:`tfopt.runtime.quality`).
    """

    stage: str
    config: dict
    versions: dict = field(default_factory=dict)
    strategy: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    history: list = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    artifacts: dict = field(default_factory=dict)
    section: dict = field(default_factory=dict)
    weights_sha256: str | None = None
    fingerprint: str | None = None
    warnings: list = field(default_factory=list)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    tfopt_version: str = ""
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self):
        if self.stage not in STAGES:
            raise ValueError(f"stage {self.stage!r} is not one of {STAGES}")
        if not self.tfopt_version:
            from tfopt._version import __version__

            self.tfopt_version = __version__

    def to_dict(self) -> dict:
        """The ``run.json`` content: the common keys, then the section under the stage's name."""
        out = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "section"
        }
        if self.stage != "train":  # train's own facts are the common "train" section
            out[self.stage] = self.section
        return out

    @classmethod
    def from_dict(cls, raw: dict) -> RunRecord:
        """Reads a ``run.json`` (schema 1 records, written before the schema had a version, too).

        Raises:
            ValueError: not a JSON object, or a figure that is text (a hand-edited record).
        """
        if not isinstance(raw, dict):
            raise ValueError(f"it holds a {type(raw).__name__}, not a JSON object")
        _check_figures(raw, "")
        stage = raw.get("stage", "train")
        names = {f.name for f in dataclasses.fields(cls)} - {"section"}
        known = {k: v for k, v in raw.items() if k in names}
        known.update(stage=stage, config=known.get("config", {}))
        section = raw.get(stage, {}) if stage != "train" else {}
        extra = {k: v for k, v in raw.items() if k not in names and k != stage}
        record = cls(**known, section=dict(section) if isinstance(section, dict) else {})
        if extra:  # schema 1 kept stage facts at the top level (e.g. "gap", "teachers")
            record.section = {**extra, **record.section}
        return record


_FIGURE_SUFFIXES = ("_ms", "_us", "_bytes", "_pt", "_seconds", "accuracy", "agreement", "loss")
_FIGURES = ("params", "flops", "macs", "examples", "epoch", "step")


def _check_figures(node, where: str) -> None:
    """Refuses a figure (a key a reader computes with) that holds text or another non-number."""
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{where}.{key}" if where else str(key)
            if (
                isinstance(key, str)
                and (key.endswith(_FIGURE_SUFFIXES) or key in _FIGURES)
                and not isinstance(value, (int, float, list, dict, type(None)))
            ):
                raise ValueError(f"{here} is {str(value)[:40]!r}, not a number")
            _check_figures(value, here)
    elif isinstance(node, list):
        for i, value in enumerate(node[:10_000]):
            _check_figures(value, f"{where}[{i}]")


@dataclass(frozen=True)
class Run:
    """A finished run directory, or a model file taken as one (see :func:`load_input`)."""

    path: str
    config: config_lib.RunConfig  # the resolved config the run was made with
    record: RunRecord
    model_file: str = ""  # a model file given instead of a run directory

    @property
    def stage(self) -> str:
        """The stage that wrote the run."""
        return self.record.stage

    @property
    def model_path(self) -> str:
        """The run's ``model.keras`` (exists for train, distill and optimize runs), or the model file."""
        return self.model_file or os.path.join(self.path, "model.keras")

    @property
    def source(self) -> str:
        """What the input was given as: the run directory, or the model file."""
        return self.model_file or self.path

    @property
    def stem(self) -> str:
        """The path later stages name their default outputs after: the run directory, or the
        model file without its suffix (``model.keras`` -> ``model``, so ``model-prune``, ``model-export``)."""
        if not self.model_file:
            return self.path
        base = self.model_file.rstrip(os.sep)
        return os.path.splitext(base)[0] if base.endswith(MODEL_SUFFIXES) else base

    @property
    def digest(self) -> str:
        """What identifies the input's model: its weights digest (run) or its file's sha256."""
        return self.record.weights_sha256 or self.record.model.get("sha256", "")


MODEL_SUFFIXES = (".keras", ".h5", ".hdf5")


def is_model_file(path: str) -> bool:
    """True for a ``.keras``/``.h5`` file or a SavedModel directory that is not a tfopt run."""
    if os.path.isfile(path):
        return path.endswith(MODEL_SUFFIXES)
    return (
        os.path.isdir(path)
        and os.path.isfile(os.path.join(path, "saved_model.pb"))
        and not os.path.isfile(os.path.join(path, "run.json"))
    )


def load_input(path: str, cfg: config_lib.RunConfig | None = None) -> Run:
    """A stage's input, resolved one way for every stage: a run directory or a model file.

    A model file becomes a run-like record: stage ``train``, the config ``cfg`` (the data the
    stage is told to use), and a ``model`` section with the file's path, sha256 and source form,
    so that the new run's record says what it started from and every later stage chains as from
    a run.

    Args:
        path: A run directory, a ``.keras``/``.h5`` file or a SavedModel directory.
        cfg: The config a model file is used with (data, runtime); defaults when None.

    Raises:
        ConfigError: neither a finished run nor a model file (the message says which to give).
    """
    if not is_model_file(path):
        return load_run(path)
    full = os.path.abspath(path)
    cfg = cfg or config_lib.RunConfig()
    cfg = config_lib.from_dict({"model": {"name": full, "args": "", "head": "keep"}}, cfg)
    record = RunRecord(
        stage="train",
        config=cfg.to_dict(),
        model={
            "name": full,
            "source": path,
            "form": "file",
            "path": full,
            "sha256": tree_digest(full),
        },
    )
    return Run(path=os.path.dirname(full), config=cfg, record=record, model_file=full)


def load_run(path: str, need_model: bool = True) -> Run:
    """Reads ``path/run.json`` and its config.

    Args:
        path: A run directory.
        need_model: Also require ``model.keras`` (every stage that starts from a model does).

    Returns:
        The run, with its config validated as a RunConfig.

    Raises:
        ConfigError: the directory has no readable run.json, or (``need_model``) no model.keras.
    """
    record_path = os.path.join(path, "run.json")
    if not os.path.isfile(record_path):
        partial = path.rstrip(os.sep) + PARTIAL_SUFFIX
        hint = (
            f"; {partial} holds an unfinished run: re-run its command to finish it"
            if os.path.isdir(partial)
            else "; give the -o directory of a finished tfopt run"
        )
        raise ConfigError(f"{path!r} is not a tfopt run directory (no run.json){hint}")
    try:
        with open(record_path, encoding="utf-8") as f:
            record = RunRecord.from_dict(json.load(f))
        cfg = config_lib.from_dict(record.config)
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(
            f"{record_path} cannot be read ({e}); re-run the stage that wrote it"
        ) from None
    run = Run(path=os.path.abspath(path), config=cfg, record=record)
    if need_model and not os.path.isfile(run.model_path):
        raise ConfigError(
            f"{path!r} is a {record.stage} run without model.keras; give a train, distill or "
            "optimize run"
        )
    return run


#: Settings that change where or how loudly a run writes, not what it computes.
NOT_FINGERPRINTED = {
    ("train", "output_dir"),
    ("train", "verbose"),
    ("train", "tensorboard"),
    ("data", "data_dir"),
    ("data", "verify"),
    ("runtime", "startup_timeout"),
    ("train", "backup_every"),
    # A checkpoint restores into any sharding (tfopt.runtime.sharding): a resume may change it.
    ("runtime", "variable_partitioner"),
    ("runtime", "min_shard_bytes"),
    ("runtime", "max_shard_bytes"),
    ("runtime", "max_shards"),
    ("runtime", "bytes_per_pack"),  # how the same sums travel, not what they are
}


def result_config(cfg, stage: str | None = None) -> dict:
    """The parts of a ``RunConfig`` that determine a run's result (the fingerprint's input): all
    of it (or of the sections ``stage`` reads) but :data:`NOT_FINGERPRINTED`."""
    out = cfg.to_dict(stage)
    for section, key in NOT_FINGERPRINTED:
        out.get(section, {}).pop(key, None)
    return out


def fingerprint(*parts: Any) -> str:
    """A digest of what determines a run's result (configs, options, tfopt's version), for resume checks.

    A backup made by another tfopt version is not resumed: its code may have built or trained
    the model differently.
    """
    from tfopt._version import __version__

    text = json.dumps([__version__, *parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def default_output(stage: str, root: str = RUNS_ROOT, cluster: str | None = None) -> str:
    """The default run directory of ``stage``: ``runs/<stage>``, or the first free ``-N`` after it."""
    return fresh_dir(os.path.join(root, stage), cluster)


def refuse_input_as_output(out: str, sources: list[str]) -> None:
    """Refuses an output directory that is an input, or holds one (a model file inside a run).

    Paths are compared resolved (symlinks, ``..``), so ``--from runs/x/model.keras -o runs/x``
    is refused as ``--from runs/x -o runs/x`` is: writing there would replace the input.

    Raises:
        ConfigError: ``out`` is, or contains, one of ``sources``.
    """
    where = os.path.realpath(out)
    for source in sources:
        real = os.path.realpath(source)
        if os.path.commonpath([where, real]) == where:
            what = "is the input" if real == where else f"holds the input {source!r}"
            raise ConfigError(
                f"-o {out!r} {what}; a stage writes a NEW run directory (--overwrite never "
                "replaces an input): give another -o"
            )


def fresh_dir(base: str, cluster: str | None = None) -> str:
    """``base`` when no finished or live run is there, else ``base-2``, ``base-3``, ...

    A crashed run's work directory (``<dir>.partial``) does not make a name taken: re-running
    the same command resumes it. A directory another live run is writing (its lock is held,
    :mod:`tfopt.core.runlock`) does, unless that run is this process's own cluster (``cluster``: the
    workers of a multi-worker run pick the directory their chief locked).
    """
    candidate, n = base, 1
    while (
        os.path.exists(os.path.join(candidate, "run.json"))
        or os.path.isfile(candidate)
        or _locked_by_another(candidate, cluster)
    ):
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def _locked_by_another(path: str, cluster: str | None) -> bool:
    held = runlock.holder(path)
    return held is not None and (cluster is None or held.get("cluster") != cluster)


def update_latest(run_dir: str) -> None:
    """Points ``<parent>/latest`` at ``run_dir`` when ``run_dir`` is directly under a ``runs`` folder.

    The link is replaced atomically (a new link renamed over the old one); a real directory
    called ``latest`` (a run written with ``-o runs/latest``) is left alone.
    """
    parent, name = os.path.split(os.path.abspath(run_dir))
    if os.path.basename(parent) != RUNS_ROOT or name == LATEST:
        return
    link = os.path.join(parent, LATEST)
    if os.path.exists(link) and not os.path.islink(link):
        return
    tmp = os.path.join(parent, f".{LATEST}-{os.getpid()}")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(name, tmp)
    os.replace(tmp, link)
