"""tfopt.data: named sources materialized as verified TFRecord shards, and the tf.data pipeline."""

from tfopt.data.pipeline import build, dataset_fn, distribute, make_dataset, parse_fn, shift_augment
from tfopt.data.sources import DatasetInfo, SplitInfo, dataset_dir, prepare, source_names

__all__ = [
    "DatasetInfo",
    "SplitInfo",
    "build",
    "dataset_dir",
    "dataset_fn",
    "distribute",
    "make_dataset",
    "parse_fn",
    "prepare",
    "shift_augment",
    "source_names",
]
