"""Test set-up: tf_keras, a data directory of the tests' own, and the one CPU split into 2 logical
devices before TF touches it."""
import atexit
import os
import shutil
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every session materializes its datasets in a directory of its own (never the user's cache);
# downloads already in the user's cache are read from there (read-only), others fetched again.
_USER_DATA = os.environ.get("TFOPT_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tfopt")
os.environ.setdefault("TFOPT_DOWNLOAD_CACHE", os.path.join(_USER_DATA, "downloads"))
os.environ["TFOPT_DATA_DIR"] = tempfile.mkdtemp(prefix="tfopt-test-data-")
atexit.register(shutil.rmtree, os.environ["TFOPT_DATA_DIR"], True)

from tfopt.runtime.devices import setup_cpu_replicas  # noqa: E402

setup_cpu_replicas(2)

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def mnist_run(tmp_path_factory):
    """A real run directory: the default CNN trained 2 epochs on 10k real MNIST images (one_device).

    Later stages (optimize, distill, export) start from it; treat it as read-only.
    """
    from tfopt import config as C
    from tfopt.train import run as train

    out = tmp_path_factory.mktemp("mnist_run")
    cfg = C.from_dict({
        "data": {"dataset": "mnist", "limit": 10000, "global_batch_size": 64, "num_shards": 4},
        "runtime": {"strategy": "one_device"},
        "train": {"epochs": 2, "output_dir": str(out), "verbose": 0, "tensorboard": False},
    })
    train(cfg)
    return str(out)
