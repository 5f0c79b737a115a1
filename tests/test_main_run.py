import json
import os


def test_mnist_run_fixture_is_a_complete_accurate_run(mnist_run):
    run = json.load(open(os.path.join(mnist_run, "run.json")))
    assert run["metrics"]["test_accuracy"] > 0.95, run["metrics"]
    assert len(run["history"]) == 2 and os.path.isfile(os.path.join(mnist_run, "model.keras"))
