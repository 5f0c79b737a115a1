"""``tfopt.train`` as a stage of the contract in :mod:`tfopt.core.stage` (found by name ``train``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tfopt.core.errors import ConfigError
from tfopt.core.stage import check_keys


class TrainStage:
    """Trains ``cfg.model``; one input (a run directory or a model file) is fine-tuned instead."""

    name = "train"
    trains = True

    def check(self, options: Mapping[str, Any]) -> None:
        """Train reads every setting from the config: refuses any option."""
        check_keys(self.name, options, ())

    def run(
        self,
        cfg,
        inputs: Sequence[str],
        out_dir: str,
        *,
        options: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ):
        """See :meth:`tfopt.core.stage.Stage.run` and :func:`tfopt.train.stage.run`."""
        from tfopt.runs import load_input
        from tfopt.train.stage import run

        self.check(options or {})
        if len(inputs) > 1:
            raise ConfigError(
                f"stage 'train' reads at most one input (the model to fine-tune), not {len(inputs)}: "
                f"{', '.join(inputs)}"
            )
        model = cfg.model
        if inputs:  # a run directory's model.keras, or the model file itself
            model = dataclasses.replace(model, name=load_input(inputs[0], cfg).model_path)
        train = dataclasses.replace(cfg.train, output_dir=out_dir)
        return run(dataclasses.replace(cfg, model=model, train=train), overwrite=overwrite)


STAGE = TrainStage()
