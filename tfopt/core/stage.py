"""The stage contract: what every stage (train, distill, optimize, export) offers, and the registry
that finds a stage by name.

A stage is an object (a module will do) with a ``name``, ``trains`` (whether it runs a
distribution strategy, so a multi-process strategy launches it as a group of tasks), ``check``
and ``run``::

    from tfopt.core import stage

    cfg = tfopt.config.from_dict({"export": {"modes": "float32,int8"}})  # checked here
    record = stage.get("export").run(cfg, ["runs/mnist"], "runs/mnist-export")

``run(cfg, inputs, out_dir, *, options, overwrite)`` takes the run configuration (data, model,
runtime, train and each stage's own section: distill, optimize, export), the paths it reads,
each a run directory or a model file resolved one way by :func:`tfopt.runs.load_input`, the run
directory it commits, and ``options``: plain data for settings outside the config tree (the
built-in stages take none; a stage of a user's may), checked by ``check`` before TensorFlow
starts. It returns the committed :class:`~tfopt.runs.RunRecord` on the chief, None on other
tasks.

The pipeline runs every stage through :func:`get`; it imports no stage (an import-linter
contract in setup.cfg says so). The built-in stages are found by name on first use, so that
asking for one does not import TensorFlow; :func:`register` adds another.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from tfopt.core.errors import ConfigError

#: The built-in stages: name -> the module holding its ``STAGE``, in the order a pipeline runs them.
BUILTIN = {
    "train": "tfopt.train.entry",
    "distill": "tfopt.distill.entry",
    "optimize": "tfopt.optimize.entry",
    "export": "tfopt.export.entry",
    "federated": "tfopt.federated.entry",
}

_REGISTERED: dict[str, Stage] = {}


@runtime_checkable
class Stage(Protocol):
    """One stage of tfopt, as the pipeline and users run it.

    Attributes:
        name: The stage's name (``train``, ``distill``, ``optimize``, ``export``, or a user's).
        trains: True when it runs a distribution strategy: under ``multi_worker_mirrored`` and
            ``parameter_server`` every task of the launched group calls :meth:`run`.
    """

    name: str
    trains: bool

    def check(self, options: Mapping[str, Any]) -> None:
        """Validates ``options`` without starting TensorFlow.

        Raises:
            ConfigError: an unknown key or a bad value (the message names it and the fix).
        """

    def run(
        self,
        cfg: Any,
        inputs: Sequence[str],
        out_dir: str,
        *,
        options: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ) -> Any:
        """Runs the stage and commits ``out_dir``.

        Args:
            cfg: The :class:`~tfopt.config.RunConfig` it runs under.
            inputs: Run directories or model files it reads (none for training from scratch).
            out_dir: The run directory it commits.
            options: Plain data of the stage's own settings (see :meth:`check`).
            overwrite: Replace a finished run at ``out_dir``.

        Returns:
            The committed RunRecord on the chief, None on other tasks.
        """


class BaseStage:
    """What the built-in stages share: :meth:`run` checks the options, then hands them (over
    ``OPTIONS``, the options a stage reads with their defaults) to :meth:`execute`."""

    name = ""
    trains = True
    #: The options the stage reads, with their defaults (none: every setting is in the config).
    OPTIONS: Mapping[str, Any] = {}

    def check(self, options: Mapping[str, Any]) -> None:
        """Refuses an option the stage does not read (subclasses check values too)."""
        check_keys(self.name, options, tuple(self.OPTIONS))

    def run(
        self,
        cfg: Any,
        inputs: Sequence[str],
        out_dir: str,
        *,
        options: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ) -> Any:
        """See :meth:`Stage.run`."""
        self.check(options or {})
        return self.execute(
            cfg, list(inputs), out_dir, {**self.OPTIONS, **(options or {})}, overwrite
        )

    def execute(
        self, cfg: Any, inputs: list[str], out_dir: str, options: dict, overwrite: bool
    ) -> Any:
        """The stage's work, with checked ``options`` (every key of ``OPTIONS`` present)."""
        raise NotImplementedError


def register(stage: Stage) -> Stage:
    """Adds ``stage`` to the registry (a built-in of the same name is replaced); returns it.

    Raises:
        TypeError: ``stage`` lacks part of the :class:`Stage` contract.
    """
    if not isinstance(stage, Stage):
        raise TypeError(f"{stage!r} is not a Stage: it needs name, trains, check() and run()")
    _REGISTERED[stage.name] = stage
    return stage


def unregister(name: str) -> None:
    """Removes a registered stage (a built-in one comes back)."""
    _REGISTERED.pop(name, None)


def names() -> list[str]:
    """Every stage's name: the built-in ones in pipeline order, then the registered ones."""
    return [*BUILTIN, *(n for n in _REGISTERED if n not in BUILTIN)]


def get(name: str) -> Stage:
    """The stage called ``name`` (a registered one first, then the built-in one).

    Raises:
        ConfigError: no stage has that name (the message lists the names there are).
    """
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in BUILTIN:
        raise ConfigError(
            f"stage {name!r} is not known; give one of {', '.join(names())} "
            "(or register yours with tfopt.core.stage.register)"
        )
    return importlib.import_module(BUILTIN[name]).STAGE


def check_keys(stage: str, options: Mapping[str, Any], valid: Sequence[str]) -> None:
    """Refuses an option ``stage`` does not read.

    Raises:
        ConfigError: naming the first unknown key and the keys ``stage`` reads.
    """
    for key in options:
        if key not in valid:
            raise ConfigError(
                f"option {key!r} is not read by stage {stage!r}; give one of {', '.join(valid)}"
            )


def one_input(stage: str, inputs: Sequence[str]) -> str:
    """The input of a stage that reads exactly one (a run directory or a model file).

    Raises:
        ConfigError: none or several, in one line.
    """
    if len(inputs) != 1:
        raise ConfigError(
            f"stage {stage!r} reads one input (a run directory or a model file), not "
            f"{len(inputs)}: give one"
        )
    return inputs[0]
