"""tfopt: train TensorFlow models under any tf.distribute strategy and ship them to the edge.

The public API is this module's names and those of its packages' ``__all__`` (``tfopt.train``,
``tfopt.distill``, ``tfopt.optimize``, ``tfopt.export``, ``tfopt.federated``,
``tfopt.pipeline``, ``tfopt.report``, ``tfopt.data``, ``tfopt.models``, ``tfopt.runtime``,
``tfopt.launch``) and the ``tfopt.config`` tree; the notebooks use nothing else::

    import tfopt
    from tfopt import config as C

    cfg = C.from_dict({"data": {"dataset": "mnist"}, "train": {"epochs": 2}})
    trained = tfopt.run_stage("train", cfg, [], "runs/mnist")     # or tfopt.train.run(cfg)
    exported = tfopt.run_stage("export", cfg, ["runs/mnist"], "runs/mnist-export")
    print(tfopt.load_run("runs/mnist").metrics)

Everything loads on first use, so that ``import tfopt`` (and every command line's argument
check) does not start TensorFlow.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tfopt import _moved
from tfopt._version import __version__

_moved.install()

if TYPE_CHECKING:
    from tfopt.config import RunConfig
    from tfopt.runs import RunRecord

#: Name -> the module it lives in.
_EXPORTS = {
    "Distiller": "tfopt.models.distiller",
    "RunConfig": "tfopt.config",
    "RunRecord": "tfopt.runs",
    "load_run": "tfopt.runs",
    "load_input": "tfopt.runs",
    "TfoptError": "tfopt.core.errors",
    "ConfigError": "tfopt.core.errors",
    "configure_logging": "tfopt.core.log",
    "stage_names": "tfopt.core.stage",
    "register_stage": "tfopt.core.stage",
    "tf": "tfopt.core._keras",  # the TensorFlow tfopt runs on
    "keras": "tfopt.core._keras",  # tf_keras, the Keras it trains with
}
_RENAMED = {"configure_logging": "configure", "stage_names": "names", "register_stage": "register"}

__all__ = [
    "ConfigError",
    "Distiller",
    "RunConfig",
    "RunRecord",
    "TfoptError",
    "__version__",
    "config",
    "configure_logging",
    "keras",
    "load_input",
    "load_run",
    "register_stage",
    "run_stage",
    "stage_names",
    "tf",
]


def run_stage(
    name: str,
    cfg: RunConfig,
    inputs: Sequence[str] = (),
    out_dir: str = "",
    *,
    options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> RunRecord | None:
    """Runs the stage called ``name`` (``train``, ``distill``, ``optimize``, ``export``,
    ``federated`` or one
    registered with :func:`register_stage`) and commits its run directory.

    Args:
        name: The stage's name (:func:`stage_names` lists them).
        cfg: The :class:`RunConfig` it runs under.
        inputs: Run directories or model files it reads (the teachers of ``distill``; the one
            model of ``optimize`` and ``export``; none, or a model to fine-tune, for ``train``).
        out_dir: The run directory it commits.
        options: The stage's own options (optimize: ``technique``, ``sparsity``, ``flops``,
            ``epochs``, ``learning_rate``; export: ``modes``, ``eval_limit``,
            ``calibration_steps``, ``threads``, ``runs``, ``warmup``).
        overwrite: Replace a finished run at ``out_dir``.

    Returns:
        The committed :class:`RunRecord` (None on a multi-worker job's other tasks).

    Raises:
        TfoptError: an unknown stage or option, bad inputs, data or settings.
    """
    from tfopt.core.stage import get

    return get(name).run(cfg, list(inputs), out_dir, options=options, overwrite=overwrite)


def __getattr__(name):
    # Lazy (PEP 562): importing tfopt stays cheap.
    if name == "config":
        return importlib.import_module("tfopt.config")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), _RENAMED.get(name, name))
    raise AttributeError(f"module 'tfopt' has no attribute {name!r}")
