"""``tfopt.export`` as a stage of the contract in :mod:`tfopt.core.stage` (found by name ``export``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfopt.core.errors import ConfigError
from tfopt.core.stage import BaseStage, one_input
from tfopt.export.choices import DEFAULT_MODES, parse_modes, parse_threads

#: What the stage's ``options`` may hold, with their defaults (those of ``tfopt.export``).
OPTIONS = {
    "modes": DEFAULT_MODES,
    "eval_limit": 0,
    "calibration_steps": 25,
    "threads": (1, 2),
    "runs": 200,
    "warmup": 20,
}


class ExportStage(BaseStage):
    """Exports the one input (a run directory or a model file) to LiteRT in every mode, scores
    and times each file.

    Options: ``modes``, ``eval_limit`` (test examples scored, 0 = all), ``calibration_steps``
    (batches int8 and int16x8 calibrate on), ``threads``, ``runs`` and ``warmup`` (timing). A
    model file is read with ``cfg.data``; a run directory with its own data.
    """

    name = "export"
    OPTIONS = OPTIONS
    trains = False

    def check(self, options: Mapping[str, Any]) -> None:
        """Refuses an unknown option, mode, thread count or a value out of range (no TensorFlow)."""
        super().check(options)
        o = {**OPTIONS, **options}
        parse_modes(o["modes"])
        parse_threads(o["threads"])
        if o["eval_limit"] < 0 or o["runs"] < 1 or o["warmup"] < 0 or o["calibration_steps"] < 1:
            raise ConfigError(
                f"export.eval_limit={o['eval_limit']} must be >= 0, export.runs={o['runs']} >= 1, "
                f"export.warmup={o['warmup']} >= 0 and export.calibration_steps="
                f"{o['calibration_steps']} >= 1"
            )

    def settings(self, options: Mapping[str, Any]):
        """The :class:`~tfopt.export.settings.ExportSettings` that ``options`` describe."""
        from tfopt.export.settings import BenchSettings, ExportSettings

        self.check(options)
        o = {**OPTIONS, **options}
        return ExportSettings(
            modes=tuple(parse_modes(o["modes"])),
            eval_limit=o["eval_limit"],
            calibration_steps=o["calibration_steps"],
            bench=BenchSettings(
                threads=tuple(parse_threads(o["threads"])), runs=o["runs"], warmup=o["warmup"]
            ),
        )

    def execute(self, cfg, inputs: list[str], out_dir: str, options: dict, overwrite: bool):
        """See :func:`tfopt.export.runner.run`."""
        from tfopt.export.runner import run

        settings = self.settings(options)
        source = one_input(self.name, inputs)
        return run(source, settings, out_dir, overwrite=overwrite, data=cfg.data)


STAGE = ExportStage()
