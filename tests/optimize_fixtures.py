"""A tiny real run shared by the tfopt.optimize tests (trained once per test session)."""

import os

from tfopt import config as C


def tiny_run_dir(tmp_path_factory) -> str:
    """A tiny_cnn trained 2 epochs on 3,000 real MNIST images (one_device), ~78% test accuracy.

    Small graphs keep tfmot's tracing cheap, which the strategy x precision matrix multiplies.
    Treat it as read-only.
    """
    out = tmp_path_factory.getbasetemp() / "optimize_tiny_run"
    if not os.path.isfile(out / "run.json"):
        from tfopt.train import run as train

        train(
            C.from_dict(
                {
                    "data": {
                        "dataset": "mnist",
                        "limit": 3000,
                        "global_batch_size": 64,
                        "num_shards": 4,
                    },
                    "model": {"name": "tiny_cnn"},
                    "runtime": {"strategy": "one_device"},
                    "train": {
                        "epochs": 2,
                        "output_dir": str(out),
                        "verbose": 0,
                        "tensorboard": False,
                    },
                }
            )
        )
    return str(out)
