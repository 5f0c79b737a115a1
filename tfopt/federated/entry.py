"""``tfopt.federated`` as a stage of the contract in :mod:`tfopt.core.stage` (found by name
``federated``)."""

from __future__ import annotations

import dataclasses

from tfopt.core.errors import ConfigError
from tfopt.core.stage import BaseStage


class FederatedStage(BaseStage):
    """Trains ``cfg.model`` over Flower clients as ``cfg.federated`` says; one input (a run
    directory or a model file) is the starting global model instead. No option."""

    name = "federated"
    trains = False  # its clients are Flower's processes, not the tasks of a launched group

    def execute(self, cfg, inputs: list[str], out_dir: str, options: dict, overwrite: bool):
        """See :func:`tfopt.federated.stage.run`."""
        from tfopt.federated.stage import run
        from tfopt.runs import load_input

        if len(inputs) > 1:
            raise ConfigError(
                f"stage 'federated' reads at most one input (the starting model), not "
                f"{len(inputs)}: {', '.join(inputs)}"
            )
        model = cfg.model
        if inputs:
            model = dataclasses.replace(model, name=load_input(inputs[0], cfg).model_path)
        train = dataclasses.replace(cfg.train, output_dir=out_dir)
        return run(dataclasses.replace(cfg, model=model, train=train), overwrite=overwrite)


STAGE = FederatedStage()
