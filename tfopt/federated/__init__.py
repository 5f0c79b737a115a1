"""tfopt.federated: train over clients that keep their data, with Flower as the engine.

``run(cfg) -> RunRecord`` is the library entry (its settings: ``cfg.federated``,
:class:`tfopt.config.FederatedConfig`) (:mod:`tfopt.federated.stage`); ``python -m
tfopt.federated`` its command line (:mod:`tfopt.federated.cli`). Imported lazily so that the
command line rejects a bad flag before TensorFlow is imported.
"""

from tfopt.core.lazy import exports

__all__, __getattr__ = exports(
    __name__, {"run": "tfopt.federated.stage", "main": "tfopt.federated.cli"}
)
