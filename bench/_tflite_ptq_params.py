"""Benchmark B5's models, settings, targets and parameters (see bench/tflite_ptq.py)."""

from __future__ import annotations

from dataclasses import dataclass

from bench.peers import ptq_tutorial

MODELS = ("cnn", "mobilenet_tiny")
SETTINGS = (("xnnpack/1t", 1), ("xnnpack/2t", 2))
# B5: int8_auto >= 3x faster than float at 1 thread, >= 3.9x smaller, <= 0.3 pt lost (PTQ), <= 0.1 pt (QAT).
TARGETS = {
    "int8_auto_speedup_1t": (">=", 3.0),
    "int8_auto_size_ratio": (">=", 3.9),
    "int8_auto_accuracy_loss_pt": ("<=", 0.3),
    "qat_accuracy_loss_pt": ("<=", 0.1),
}
ANCHOR_SPEED = "TF docs: int8 '3x+ faster'"
ANCHOR_SIZE = "TF docs: int8 '4x smaller'"
COMMAND = "PYTHONPATH=. python bench/tflite_ptq.py"


@dataclass(frozen=True)
class Params:
    """Everything that shapes the measurement (recorded in the JSON)."""

    models: tuple = MODELS
    epochs: int = 2
    limit: int = 0  # MNIST records per split (0 = full 50k/10k/10k)
    batch_size: int = 128
    calibration_steps: int = 25
    eval_limit: int = 0  # test examples scored (0 = all)
    search_limit: int = 2000  # validation examples the int8_auto / selective searches score on
    repeats: int = 5
    runs: int = 300
    warmup: int = 30
    export_runs: int = 100  # the export stage's own timings (int8_auto's search included)
    qat_seeds: int = 3
    qat_epochs: int = 1
    qat_lr: float = 1e-4
    peer_epochs: int = ptq_tutorial.EPOCHS
    peers: bool = True
    smoke: bool = False
