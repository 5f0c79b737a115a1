"""A tiny real run shared by the tfopt.optimize tests (trained once per test session)."""

from tfopt import config as C


def tiny_run_dir(tmp_path_factory) -> str:
    """A tiny_cnn trained 2 epochs on 3,000 real MNIST images (one_device), ~78% test accuracy.

    Small graphs keep tfmot's tracing cheap, which the strategy x precision matrix multiplies.
    Trained once per session, whichever pytest-xdist worker needs it first. Treat it as read-only.
    """
    from conftest import once_per_session

    return once_per_session(tmp_path_factory, "optimize_tiny_run", _train_tiny)


def _train_tiny(out: str) -> str:
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
                    "output_dir": out,
                    "verbose": 0,
                    "tensorboard": False,
                },
            }
        )
    )
    return out
