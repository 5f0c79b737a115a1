"""Benchmark B7's sides, parameters and smoke settings (see bench/overhead.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass

#: The script every harness process runs (``overhead.py _run ...``).
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "overhead.py")
SIDES = ("tfopt", "bare_tuned", "bare_default")
STRATEGIES = ("one_device", "mirrored")
PRECISIONS = ("float32", "mixed_bfloat16")
TARGET_PCT = 2.0  # tfopt at most this much slower per step than the tuned bare fit


@dataclass(frozen=True)
class Params:
    """Everything that shapes the measurement (recorded in the JSON)."""

    model: str = "cnn"
    batch: int = 128  # tfopt's default global batch
    epochs: int = 3  # the first is warm-up
    # Records per split (0 = all: 50k train, 10k validation). 4096 = 32 steps per epoch (one
    # execution of tfopt's 32 steps) keeps ~3 min of TensorFlow start-ups and 3 epochs per run
    # within ~15 min on a 2-core machine; every per-epoch cost then weighs 12x what it does on
    # the full split (harsher to the side that has more of it).
    limit: int = 4096
    # (precision, strategy, sides): bf16 only where it matters most, to keep the run short.
    cells: tuple = (
        ("float32", "one_device", SIDES),
        ("float32", "mirrored", SIDES),
        ("mixed_bfloat16", "one_device", ("tfopt", "bare_tuned")),
    )
    repeats: int = 3
    smoke: bool = False


SMOKE = {
    "batch": 32,
    "epochs": 2,
    "limit": 512,
    "repeats": 1,
    "smoke": True,
    "cells": (("float32", "one_device", SIDES), ("float32", "mirrored", ("tfopt", "bare_tuned"))),
}
