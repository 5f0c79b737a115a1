"""Keeps benchmark B12 (bench/dp_mnist.py) runnable and honest: its ``--smoke`` mode end to end,
and the committed result.

Not a performance test: it checks that every run spent what ``dp-accounting`` computes for its
noise, sampling rate and steps (called here, not through tfopt), that every figure is recomputed
from the raw runs the JSON holds, and that each verdict follows from its number.
"""

import os
import statistics

import pytest
from bench_checks import committed, rdp_epsilon, run_smoke

TABLE = {1.20: 95.0, 2.92: 96.6, 9.74: 97.3}


@pytest.mark.slow
@pytest.mark.bench
def test_dp_mnist_benchmark_smoke(tmp_path):
    proc, res = run_smoke("dp_mnist.py", tmp_path, workdir=False)
    assert "## B12: differential privacy" in proc.stdout
    assert res["params"]["smoke"] is True
    check_result(res)


def check_result(res: dict) -> None:
    """Everything a B12 result must get right whatever its figures."""
    assert res["id"] == "B12" and res["lscpu"]["flags"]
    p = res["params"]
    runs = res["runs"]
    assert len(runs) == len(p["models"]) * len(p["epsilons"]) * len(p["seeds"])
    for r in runs:
        rate = 256 / r["examples"]
        spent = rdp_epsilon(r["noise_multiplier"], rate, r["steps"], 1e-5)
        assert r["epsilon"] == pytest.approx(spent, rel=1e-6), r
        assert spent <= r["target_epsilon"] * (1 + 1e-6), r  # the budget held
    by_name = {f["name"]: f for f in res["figures"]}
    for model in p["models"]:
        for eps in p["epsilons"]:
            f = by_name[f"{model}, epsilon {eps:g}: test accuracy"]
            cell = [r for r in runs if r["model"] == model and r["target_epsilon"] == eps]
            assert f["values"] == pytest.approx([100 * r["test_accuracy"] for r in cell])
            assert f["bound"] == TABLE[eps]
            assert f["status"] == ("pass" if f["value"] > TABLE[eps] else "MISS")
        cost = res["cost"][model]
        assert len(cost["private"]) == len(cost["plain"]) == p["cost_repeats"]
        ratio = by_name[f"{model}: a private epoch over a non-private one"]
        expected = [a / b for a, b in zip(cost["private"], cost["plain"], strict=True)]
        assert ratio["value"] == pytest.approx(statistics.median(expected))
        assert all(how.startswith(("ghost", "vectorized")) for how in cost["methods"].values())


def test_the_committed_dp_mnist_result_holds_together():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.exists(os.path.join(repo, "bench", "results", "dp_mnist.json")):
        pytest.skip("bench/results/dp_mnist.json is not committed yet")
    res = committed("dp_mnist")
    assert res["params"]["smoke"] is False
    assert res["params"]["seeds"] == [1, 2, 3] and res["params"]["limit"] == 0
    check_result(res)
