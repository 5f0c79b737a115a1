"""tfopt.train: train a registered model under any tf.distribute strategy.

``run(cfg) -> RunRecord`` is the library entry (see :mod:`tfopt.train.stage`); ``python -m
tfopt.train`` is its command line (:mod:`tfopt.train.cli`). ``run`` is imported lazily so that
the command line rejects a bad flag before TensorFlow is imported.
"""

from tfopt.core.lazy import exports

__all__, __getattr__ = exports(__name__, {"run": "tfopt.train.stage", "main": "tfopt.train.cli"})
