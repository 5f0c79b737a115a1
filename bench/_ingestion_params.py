"""Benchmark B1's parameters, targets, anchors and smoke settings (see bench/ingestion.py)."""

from __future__ import annotations

from dataclasses import dataclass

DATASET_VERSION = 1  # bump when the synthetic image generator or record layout changes
NUM_CLASSES = 10
NORMALIZE = "imagenet"  # data.normalize of the tfopt side; the peers get the same mean/std
COMMAND = "PYTHONPATH=. python bench/ingestion.py"

TARGETS = {
    "epoch1_ratio": (">=", 1.8),
    "cached_ratio": (">=", 4.0),
    "input_bound_pct": ("<=", 2.0),
    "autotune_gap_pct": ("<=", 3.0),
}
ANCHORS = {
    "epoch1_ratio": "tf.data paper: parallelism ~0.77x per core (~1.5x on 2 cores)",
    "cached_ratio": "tf.data paper: caching a further ~2x",
    "input_bound_pct": None,
    "autotune_gap_pct": "tf.data paper: AUTOTUNE within 1-4% of expert tuning",
}


@dataclass(frozen=True)
class Params:
    """Everything that shapes the measurement (recorded in the JSON)."""

    images: int = 2048
    shards: int = 16
    min_side: int = 128
    max_side: int = 256
    resize: int = 128  # decode -> resize to resize x resize (deterministic, before the cache)
    crop: int = 112  # random crop + flip + normalize (after the cache)
    batch_size: int = 64
    repeats: int = 3
    trials: int = 3  # per repeat, each side is measured this many times, interleaved; best kept
    cached_epochs: int = 3  # epochs timed after epoch 1, per trial (their median is used)
    model_width: int = 32  # filters of the first conv of the step-time CNN
    seed: int = 1234
    grid_calls: tuple = (1, 2, 4)
    grid_cycle: tuple = (1, 2, 4)
    grid_prefetch: tuple = (1, 2)
    smoke: bool = False


SMOKE = dict(
    images=64,
    min_side=40,
    max_side=64,
    resize=40,
    crop=32,
    batch_size=16,
    repeats=1,
    trials=1,
    cached_epochs=1,
    model_width=4,
    grid_calls=(1, 2),
    grid_cycle=(2,),
    grid_prefetch=(1,),
    smoke=True,
)
