"""tfopt.distill: distil trained teacher runs into a student (optionally compressed while it learns).

``run(cfg, teachers) -> RunRecord`` is the library entry (its settings: ``cfg.distill``,
:class:`tfopt.config.DistillConfig`) (:mod:`tfopt.distill.stage`); ``python -m
tfopt.distill`` its command line (:mod:`tfopt.distill.cli`). Imported lazily so that the command
line rejects a bad flag before TensorFlow is imported.
"""

from tfopt.core.lazy import exports
from tfopt.distill.options import DistillOptions, parse_feature

_names, __getattr__ = exports(__name__, {"run": "tfopt.distill.stage", "main": "tfopt.distill.cli"})
__all__ = ["DistillOptions", "parse_feature", *_names]
