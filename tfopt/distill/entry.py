"""``tfopt.distill`` as a stage of the contract in :mod:`tfopt.core.stage` (found by name ``distill``)."""

from __future__ import annotations

from tfopt.core.stage import BaseStage


class DistillStage(BaseStage):
    """Distils the teachers given as inputs (run directories or model files) into ``cfg.model``,
    as ``cfg.distill`` says. Every setting is in the config: no option."""

    name = "distill"

    def execute(self, cfg, inputs: list[str], out_dir: str, options: dict, overwrite: bool):
        """See :func:`tfopt.distill.stage.run`."""
        from tfopt.distill.stage import run

        return run(cfg, tuple(inputs), out_dir, overwrite=overwrite)


STAGE = DistillStage()
