"""``tfopt.distill`` as a stage of the contract in :mod:`tfopt.core.stage` (found by name ``distill``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tfopt.core.stage import check_keys


class DistillStage:
    """Distils the teachers given as inputs (run directories or model files) into ``cfg.model``,
    as ``cfg.distill`` says."""

    name = "distill"
    trains = True

    def check(self, options: Mapping[str, Any]) -> None:
        """Distill reads every setting from the config (its ``distill`` section): refuses any option."""
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
        """See :meth:`tfopt.core.stage.Stage.run` and :func:`tfopt.distill.stage.run`."""
        from tfopt.distill.stage import run

        self.check(options or {})
        return run(cfg, tuple(inputs), out_dir, overwrite=overwrite)


STAGE = DistillStage()
