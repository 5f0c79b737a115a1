"""``tfopt.optimize`` as a stage of the contract in :mod:`tfopt.core.stage` (found by name ``optimize``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfopt.core.errors import ConfigError
from tfopt.core.stage import BaseStage, one_input

#: What the stage's ``options`` may hold, with their defaults (those of ``tfopt.optimize``).
OPTIONS = {"technique": "prune", "sparsity": 0.5, "flops": 0.5, "epochs": 1, "learning_rate": 5e-4}


class OptimizeStage(BaseStage):
    """Compresses the one input (a run directory or a model file) with ``options["technique"]``.

    Options: ``technique`` (a name of :data:`tfopt.compress.techniques.TECHNIQUES`), ``sparsity``
    (pruning), ``flops`` (low_rank and channel pruning: the result's multiply-adds as a share of
    the input's), ``epochs`` (fine-tuning epochs per phase) and ``learning_rate``.
    """

    name = "optimize"
    OPTIONS = OPTIONS

    def check(self, options: Mapping[str, Any]) -> None:
        """Refuses an unknown option, technique, or a value out of range (no TensorFlow)."""
        from tfopt.compress.techniques import TECHNIQUES

        super().check(options)
        o = {**OPTIONS, **options}
        if o["technique"] not in TECHNIQUES:
            raise ConfigError(
                f"optimize.technique={o['technique']!r} is not known; give one of {', '.join(TECHNIQUES)}"
            )
        if not 0 <= o["sparsity"] < 1 or not 0 < o["flops"] <= 1:
            raise ConfigError(
                f"optimize.sparsity={o['sparsity']} must be in [0, 1) and optimize.flops="
                f"{o['flops']} in (0, 1]"
            )
        if o["epochs"] < 1 or not o["learning_rate"] > 0:
            raise ConfigError(
                f"optimize.epochs={o['epochs']} must be >= 1 and optimize.learning_rate="
                f"{o['learning_rate']} > 0"
            )

    def settings(self, options: Mapping[str, Any]):
        """The :class:`~tfopt.optimize.runner.OptimizeSettings` that ``options`` describe."""
        from tfopt.compress.channel_prune import ChannelSpec
        from tfopt.compress.low_rank import LowRankSpec
        from tfopt.compress.prune import PruneSpec
        from tfopt.optimize.runner import OptimizeSettings

        self.check(options)
        o = {**OPTIONS, **options}
        return OptimizeSettings(
            technique=o["technique"],
            prune=PruneSpec(sparsity=o["sparsity"]),
            low_rank=LowRankSpec(flops=o["flops"]),
            channels=ChannelSpec(flops=o["flops"]),
            epochs=o["epochs"],
            learning_rate=o["learning_rate"],
        )

    def execute(self, cfg, inputs: list[str], out_dir: str, options: dict, overwrite: bool):
        """See :func:`tfopt.optimize.runner.run`."""
        from tfopt.optimize.runner import run

        settings = self.settings(options)
        source = one_input(self.name, inputs)
        (outcome,) = run(source, cfg, [settings], [out_dir], keep_going=False, overwrite=overwrite)
        return outcome.record


STAGE = OptimizeStage()
