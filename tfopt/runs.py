"""Reading a finished run directory: what every stage after training starts from."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from tfopt import config as config_lib
from tfopt.errors import ConfigError, ModelError


@dataclass(frozen=True)
class Run:
    """A run directory written by ``python -m tfopt.train`` (or a later stage)."""

    path: str
    config: config_lib.RunConfig  # the resolved config the run was made with
    record: dict  # the whole run.json

    @property
    def model_path(self) -> str:
        """The run's ``model.keras``."""
        return os.path.join(self.path, "model.keras")

    def load_model(self, trust_model: bool = False):
        """Loads the run's model through the safe loader (see ``tfopt.models.io.load_model``)."""
        from tfopt.models.io import load_model

        return load_model(self.model_path, trust_model=trust_model)


def load_run(path: str) -> Run:
    """Reads ``path/run.json`` and its config.

    Args:
        path: A run directory.

    Returns:
        The run, with its config validated as a RunConfig.

    Raises:
        ConfigError: the directory has no readable run.json.
        ModelError: the directory has no model.keras.
    """
    record_path = os.path.join(path, "run.json")
    if not os.path.isfile(record_path):
        raise ConfigError(f"{path!r} is not a tfopt run directory (no run.json); "
                          "give the -o directory of a `python -m tfopt.train` run")
    try:
        with open(record_path, encoding="utf-8") as f:
            record = json.load(f)
        cfg = config_lib.from_dict(record["config"])
    except (ValueError, KeyError) as e:
        raise ConfigError(f"{record_path} cannot be read ({e}); re-run the stage that wrote it") from None
    run = Run(path=os.path.abspath(path), config=cfg, record=record)
    if not os.path.isfile(run.model_path):
        raise ModelError(f"{path!r} has no model.keras; re-run the stage that wrote it")
    return run
