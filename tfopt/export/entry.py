"""``tfopt.export`` as a stage of the contract in :mod:`tfopt.core.stage` (found by name ``export``)."""

from __future__ import annotations

from tfopt.core.stage import BaseStage, one_input


class ExportStage(BaseStage):
    """Exports the one input (a run directory or a model file) to LiteRT in every mode of
    ``cfg.export`` (:class:`tfopt.config.ExportConfig`), scores and times each file. A model file
    is read with ``cfg.data``; a run directory with its own data. The stage takes no options:
    every setting is in the config tree.
    """

    name = "export"
    trains = False

    def settings(self, cfg):
        """The :class:`~tfopt.export.settings.ExportSettings` of ``cfg.export``.

        Raises:
            ConfigError: a mode, thread count or runtime that does not parse.
        """
        from tfopt.export.settings import settings_from

        return settings_from(cfg.export, cfg.model.trust)

    def execute(self, cfg, inputs: list[str], out_dir: str, options: dict, overwrite: bool):
        """See :func:`tfopt.export.runner.run`."""
        from tfopt.export.runner import run

        source = one_input(self.name, inputs)
        return run(source, self.settings(cfg), out_dir, overwrite=overwrite, data=cfg.data)


STAGE = ExportStage()
