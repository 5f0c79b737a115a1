"""tfopt.train: train a registered model under any tf.distribute strategy.

``run(cfg) -> RunRecord`` is the library entry (see :mod:`tfopt.train.stage`); ``python -m
tfopt.train`` is its command line (:mod:`tfopt.train.cli`). ``run`` is imported lazily so that
the command line rejects a bad flag before TensorFlow is imported.
"""

__all__ = ["run"]


def __getattr__(name):
    if name == "run":
        from tfopt.train.stage import run

        return run
    raise AttributeError(f"module 'tfopt.train' has no attribute {name!r}")
