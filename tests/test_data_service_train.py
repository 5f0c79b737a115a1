"""Training through the in-process tf.data service matches training without it."""

import pytest

from tfopt import config as C
from tfopt.data import service
from tfopt.train import run as train

# Same model, seed and steps: the two runs differ only in the order the batches arrive.
TOLERANCE = 0.08


def _cfg(out, **data):
    return C.from_dict(
        {
            "data": {
                "dataset": "mnist",
                "limit": 512,
                "global_batch_size": 32,
                "num_shards": 4,
                **data,
            },
            "model": {"name": "mlp"},
            "runtime": {"strategy": "one_device"},
            "train": {"epochs": 2, "output_dir": str(out), "verbose": 0, "tensorboard": False},
        }
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["distributed_epoch", "parallel_epochs"])
def test_training_through_service_matches(tmp_path, mode):
    plain = train(_cfg(tmp_path / "plain")).to_dict()
    before = len(service.jobs())
    served = train(_cfg(tmp_path / "served", service="local", service_mode=mode)).to_dict()
    sent = service.jobs()[before:]
    assert any("-train-" in name for name in sent), (
        f"the training input did not go through the service: {sent}"
    )
    acc, ref = served["metrics"]["test_accuracy"], plain["metrics"]["test_accuracy"]
    print(f"\n{mode}: test accuracy through the service {acc:.4f}, without {ref:.4f}")
    assert abs(acc - ref) <= TOLERANCE, f"through the service {acc:.4f} vs without {ref:.4f}"
