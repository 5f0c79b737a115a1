"""``tfopt.optimize`` as a stage of the contract in :mod:`tfopt.core.stage` (found by name ``optimize``)."""

from __future__ import annotations

from tfopt.core.errors import ConfigError
from tfopt.core.stage import BaseStage, one_input


class OptimizeStage(BaseStage):
    """Compresses the one input (a run directory or a model file) with the technique that
    ``cfg.optimize`` names, read with the rest of that section (:class:`tfopt.config.OptimizeConfig`).
    The stage takes no options: every setting is in the config tree.
    """

    name = "optimize"

    def settings(self, cfg):
        """The :class:`~tfopt.optimize.runner.OptimizeSettings` of ``cfg.optimize``'s one technique.

        Raises:
            ConfigError: no technique, several, or one that is not known.
        """
        from tfopt.compress.techniques import TECHNIQUES
        from tfopt.optimize.settings import settings_for

        names = cfg.optimize.techniques()
        if len(names) != 1 or names[0] not in TECHNIQUES:
            raise ConfigError(
                f"optimize.technique={cfg.optimize.technique!r}: stage 'optimize' runs one "
                f"technique; give one of {', '.join(TECHNIQUES)}"
            )
        return settings_for(cfg.optimize, names[0], cfg.model.trust)

    def execute(self, cfg, inputs: list[str], out_dir: str, options: dict, overwrite: bool):
        """See :func:`tfopt.optimize.runner.run`."""
        from tfopt.optimize.runner import run

        source = one_input(self.name, inputs)
        settings = self.settings(cfg)
        (outcome,) = run(source, cfg, [settings], [out_dir], keep_going=False, overwrite=overwrite)
        return outcome.record


STAGE = OptimizeStage()
