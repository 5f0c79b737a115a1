"""``tfopt.train`` as a stage of the contract in :mod:`tfopt.core.stage` (found by name ``train``)."""

from __future__ import annotations

import dataclasses

from tfopt.core.errors import ConfigError
from tfopt.core.stage import BaseStage


class TrainStage(BaseStage):
    """Trains ``cfg.model``; one input (a run directory or a model file) is fine-tuned instead.
    Every setting is in the config: no option."""

    name = "train"

    def execute(self, cfg, inputs: list[str], out_dir: str, options: dict, overwrite: bool):
        """See :func:`tfopt.train.stage.run`."""
        from tfopt.runs import load_input
        from tfopt.train.stage import run

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
