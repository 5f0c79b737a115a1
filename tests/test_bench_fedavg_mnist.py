"""Keeps benchmark B13 (bench/fedavg_mnist.py) runnable and honest: its ``--smoke`` mode end to
end, and the committed result.

Not a performance test: it recomputes every figure from the per-round validation accuracies the
JSON holds, the bytes per round from the model's parameter count (float32, to and from every
sampled client), and the DP variant's epsilon from ``dp-accounting`` called here, not through
tfopt; and it checks that each verdict follows from its number.
"""

import os

import pytest
from bench_checks import committed, rdp_epsilon, run_smoke

PAPER = {"iid": 20, "noniid": 229}
PARAMS = 1_663_370  # McMahan et al.'s MNIST CNN


@pytest.mark.slow
@pytest.mark.bench
def test_fedavg_mnist_benchmark_smoke(tmp_path):
    proc, res = run_smoke("fedavg_mnist.py", tmp_path, workdir=False)
    assert "## B13: federated averaging" in proc.stdout
    assert res["params"]["smoke"] is True
    check_result(res)


def check_result(res: dict) -> None:
    """Everything a B13 result must get right whatever its figures."""
    assert res["id"] == "B13" and res["lscpu"]["flags"]
    p = res["params"]
    tuning = res["tuning"]
    assert set(tuning["scores"]) == {str(lr) for lr in p["lrs"]}
    assert tuning["scores"][str(tuning["chosen"])] == max(tuning["scores"].values())
    sampled = max(int(p["clients"] * p["fraction"]), 1)
    by_name = {f["name"]: f for f in res["figures"]}
    assert list(res["runs"]) == p["runs"]
    for name, run in res["runs"].items():
        accuracies = run["val_accuracy"]
        assert len(accuracies) == run["rounds"]
        reached = [i + 1 for i, a in enumerate(accuracies) if a >= 0.99]
        assert run["rounds_to_target"] == (reached[0] if reached else None)
        assert run["payload_bytes"] == 4 * PARAMS
        assert run["bytes_per_round"] == 2 * sampled * 4 * PARAMS
        assert by_name[f"{name}: bytes sent per round"]["value"] == pytest.approx(
            run["bytes_per_round"] / 1e6
        )
    for name, label in (("iid", "IID"), ("noniid", "pathological non-IID")):
        if name in res["runs"]:
            f = by_name[f"FedAvg {label}: rounds to 99%"]
            reached = res["runs"][name]["rounds_to_target"]
            assert f["value"] == reached and f["bound"] == PAPER[name]
            if reached is None:  # a miss once more rounds than the paper's ran, else unknown
                missed = res["runs"][name]["rounds"] >= PAPER[name]
                assert f["status"] == ("MISS" if missed else "n/a")
            else:
                assert f["status"] == status(reached, PAPER[name])
    if "dp" in res["runs"]:
        dp = res["runs"]["dp"]
        privacy = dp["privacy"]
        spent = rdp_epsilon(privacy["noise_multiplier"], sampled / p["clients"], dp["rounds"], 1e-5)
        assert privacy["epsilon"]["rdp"] == pytest.approx(spent, rel=1e-6)


def status(value: float, bound: float) -> str:
    return "pass" if value <= bound else "MISS"


def test_the_committed_fedavg_mnist_result_holds_together():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.exists(os.path.join(repo, "bench", "results", "fedavg_mnist.json")):
        pytest.skip("bench/results/fedavg_mnist.json is not committed yet")
    res = committed("fedavg_mnist")
    assert res["params"]["smoke"] is False
    assert (res["params"]["clients"], res["params"]["fraction"]) == (100, 0.1)
    assert (res["params"]["local_epochs"], res["params"]["batch"]) == (5, 10)
    check_result(res)
