"""Test set-up: tf_keras, and the one CPU split into 2 logical devices before TF touches it."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfopt.runtime.devices import setup_cpu_replicas  # noqa: E402

setup_cpu_replicas(2)

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def mnist_run(tmp_path_factory):
    """A real run directory: the default CNN trained 2 epochs on 10k real MNIST images (one_device).

    Later stages (optimize, distill, export) start from it; treat it as read-only.
    """
    from tfopt import config as C
    from tfopt.train import train

    out = tmp_path_factory.mktemp("mnist_run")
    cfg = C.from_dict({
        "data": {"dataset": "mnist", "limit": 10000, "global_batch_size": 64, "num_shards": 4},
        "runtime": {"strategy": "one_device"},
        "train": {"epochs": 2, "output_dir": str(out), "verbose": 0, "tensorboard": False},
    })
    train(cfg)
    return str(out)
