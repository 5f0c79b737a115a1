"""tfopt.data: named sources materialized as verified TFRecord shards, and the tf.data pipeline.

The names below load on first use (PEP 562), so ``python -m tfopt.data.to_folder --help`` answers
without starting TensorFlow.
"""

import importlib

_HOMES = {
    "build": "pipeline",
    "crop_flip_augment": "augment",
    "xla_available": "augment",
    "dataset_fn": "distributed",
    "distribute": "distributed",
    "make_dataset": "pipeline",
    "parse_fn": "parse",
    "shift_augment": "pipeline",
    "DatasetInfo": "sources",
    "SplitInfo": "sources",
    "check": "sources",
    "write_folder": "to_folder",
    "dataset_dir": "sources",
    "prepare": "sources",
    "source_names": "sources",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(importlib.import_module(f"tfopt.data.{_HOMES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
