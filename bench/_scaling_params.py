"""Benchmark B3's parameters, targets and smoke settings (see bench/scaling.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The script every harness process runs (``scaling.py _train ...``).
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scaling.py")
TARGETS = {
    "efficiency": (">=", 0.90),  # throughput(2 MWMS workers) / throughput(2 independent processes)
    "backup_overhead_pct": ("<=", 3.0),  # % slower per step with --backup-every
}
PHASES = ("scaling", "allreduce", "backup", "links")
MB = 1 << 20


@dataclass(frozen=True)
class Params:
    """Everything that shapes the measurement (recorded in the JSON)."""

    # The scaling phase's model: compute-heavy, as the protocol asks (22M multiply-adds per image
    # for 0.24M parameters; the default ``cnn`` does 4M for 0.22M, mostly in its dense layer, so
    # its all-reduce weighs 5x more per unit of compute).
    model: str = "wide_cnn"
    batch: int = 64  # per-process batch B (side b: global batch 2B)
    limit: int = 2048  # MNIST records per split (the training stream repeats; cached in memory)
    warmup_steps: int = 32  # untimed: tracing, filling the tf.data cache
    steps: int = 96  # timed steps per process
    steps_per_execution: int = 0  # 0 = tfopt's automatic choice
    intra_threads: int = 1  # TF_NUM_INTRAOP_THREADS of pinned processes
    inter_threads: int = 1  # TF_NUM_INTEROP_THREADS of pinned processes
    sizes_mb: tuple = (1, 4, 16, 64)
    allreduce_warmup: int = 3
    allreduce_iters: int = 20
    collective: str = "auto"  # runtime.collective of the all-reduce workers
    bandwidth_mb: int = 256
    bandwidth_copies: int = 3  # loopback copies before and after the all-reduces
    backup_every: int = 50
    backup_model: str = "cnn"  # tfopt's default model
    backup_batch: int = 128  # tfopt's default global batch
    backup_warmup_steps: int = 50
    backup_steps: int = 300
    backup_pinned: bool = False  # False: unpinned, TensorFlow's default threads (what a user runs)
    # links phase: side b on two simulated hosts (tfopt launch --hosts 2 --link RATE)
    link_gbits: tuple = (0, 1, 10, 25)  # 0: the loopback, in the same run (no --hosts)
    link_variants: tuple = ("float32", "packed", "bfloat16")
    pack_bytes: int = 256 << 10  # the "packed" variant's --bytes-per-pack
    repeats: int = 3
    smoke: bool = False


# the links phase's variants: what each adds to the workers' `python -m tfopt.train` flags
LINK_VARIANTS = {
    "float32": [],
    "packed": ["--bytes-per-pack", "{pack}"],
    "bfloat16": ["--allreduce-dtype", "bfloat16"],
}


# smoke: backups every 34 steps, so that tfopt's steps per execution (17, the largest divisor <= 32)
# gives executions with and without a backup, as at the default 50 (25)
SMOKE = {
    "batch": 16,
    "limit": 512,
    "warmup_steps": 8,
    "steps": 16,
    "steps_per_execution": 4,
    "allreduce_warmup": 1,
    "allreduce_iters": 7,
    "bandwidth_mb": 64,
    "bandwidth_copies": 2,
    "backup_every": 34,
    "backup_batch": 16,
    "backup_warmup_steps": 34,
    "backup_steps": 34,
    "link_gbits": (1,),
    "link_variants": ("packed",),
    "repeats": 1,
    "smoke": True,
}
