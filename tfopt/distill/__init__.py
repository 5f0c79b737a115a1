"""tfopt.distill: distil trained teacher runs into a student (optionally compressed while it learns).

``run(cfg, teachers) -> RunRecord`` is the library entry (its settings: ``cfg.distill``,
:class:`tfopt.config.DistillConfig`) (:mod:`tfopt.distill.stage`); ``python -m
tfopt.distill`` its command line (:mod:`tfopt.distill.cli`). Imported lazily so that the command
line rejects a bad flag before TensorFlow is imported.
"""

from tfopt.distill.options import DistillOptions, parse_feature

__all__ = ["DistillOptions", "parse_feature", "run"]


def __getattr__(name):
    if name == "run":
        from tfopt.distill.stage import run

        return run
    raise AttributeError(f"module 'tfopt.distill' has no attribute {name!r}")
