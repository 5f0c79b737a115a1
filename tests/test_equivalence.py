"""Strategies compute the same training: one_device is the reference every other strategy is held to.

* mirrored on 2 logical CPUs vs one_device at the same global batch, seed and data order: the
  loss after every step agrees to rtol 1e-4 (the replicas split each global batch; their
  gradients are summed and scaled exactly like one device's).
* multi_worker_mirrored (2 real processes) vs one process at the same global batch: the workers
  read different shards, so the batches hold other examples; the final weights' max |dw| is
  reported and bounded by twice what another data order alone gives one process.
"""

import os
import subprocess
import sys

from tfopt.core._keras import keras

import numpy as np
import pytest
from isolation import ISOLATED

from tfopt import config as C

# mlp: no batch norm (per-replica statistics would differ by design) and no dropout (per-replica RNG).
COMMON = {
    "data": {"dataset": "digits", "global_batch_size": 64, "num_shards": 2, "deterministic": True},
    "model": {"name": "mlp", "dropout": 0.0},
}


class StepLosses(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def _train(tmp_path, strategy, name, data_seed=42):
    from tfopt.train import run

    cfg = C.from_dict(
        {
            **COMMON,
            "data": {**COMMON["data"], "seed": data_seed},
            "runtime": {"strategy": strategy},
            "train": {
                "epochs": 2,
                "steps_per_execution": 1,
                "output_dir": str(tmp_path / name),
                "verbose": 0,
                "tensorboard": False,
            },
        }
    )
    losses = StepLosses()
    record = run(cfg, callbacks=[losses])
    return losses.losses, record


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    out = tmp_path_factory.mktemp("equivalence")
    losses, record = _train(out, "one_device", "od")
    return losses, record, str(out / "od")


@pytest.mark.slow
def test_mirrored_matches_one_device_step_by_step(tmp_path, one_device):
    od, od_rec, _ = one_device
    mirrored, m_rec = _train(tmp_path, "mirrored", "m")
    assert (
        m_rec.strategy["num_replicas"] == 2
        and len(od) == len(mirrored) == 2 * od_rec.train["steps_per_epoch"]
    )
    np.testing.assert_allclose(mirrored, od, rtol=1e-4)
    assert od[-1] < 0.8 * od[0]  # it trained


def _weights(run_dir):
    from tfopt.models.io import load_model

    return load_model(os.path.join(run_dir, "model.keras")).get_weights()


@pytest.mark.slow
def test_two_worker_mwms_stays_close_to_one_process(tmp_path, one_device):
    cmd = [
        *ISOLATED,
        sys.executable,
        "-m",
        "tfopt.launch",
        "--workers",
        "2",
        "--timeout",
        "240",
        "--",
        sys.executable,
        "-m",
        "tfopt.train",
        "--strategy",
        "multi_worker_mirrored",
        "--dataset",
        "digits",
        "--model",
        "mlp",
        "--set",
        "model.dropout=0",
        "--batch-size",
        "64",
        "--epochs",
        "2",
        "--steps-per-execution",
        "1",
        "--set",
        "data.num_shards=2",
        "--quiet",
        "-o",
        str(tmp_path / "mwms"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _train(tmp_path, "one_device", "od_other_order", data_seed=7)
    od, mwms, other = (
        _weights(p) for p in (one_device[2], tmp_path / "mwms", tmp_path / "od_other_order")
    )
    dw = max(float(np.max(np.abs(a - b))) for a, b in zip(od, mwms))
    natural = max(float(np.max(np.abs(a - b))) for a, b in zip(od, other))
    print(
        f"2-worker MWMS vs one process: max |dw| = {dw:.4g}; another data order alone: {natural:.4g}"
    )
    assert dw <= 2 * natural
