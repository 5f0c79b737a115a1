"""Keeps benchmark B6 (bench/distillation.py) runnable: its tiny ``--smoke`` mode, end to end.

Not an accuracy test: it checks that the protocol runs, prints its table and writes the result
schema, that the selection read the validation split only and each arm kept its best trial, and
that every figure and verdict follows from the per-seed accuracies.
"""

import json
import os
import statistics
import subprocess
import sys

import pytest
from bench_checks import OPS, committed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.bench
def test_distillation_benchmark_smoke(tmp_path):
    out = tmp_path / "distillation.json"
    env = dict(
        os.environ,
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "bench", "distillation.py"),
            "--smoke",
            "--out",
            str(out),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "| B6 distillation" in proc.stdout and "gap closed, teacher A" in proc.stdout
    res = json.loads(out.read_text())
    assert res["params"]["smoke"] is True
    check_result(res)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]


def check_result(res: dict) -> None:
    """Everything a B6 result must get right whatever its figures (a smoke run's or a full run's)."""
    assert res["id"] == "B6" and len(res["per_seed"]) == res["params"]["seeds"]
    assert {"processor", "usable_cores"} <= set(res["environment"]) and res["lscpu"]["flags"]

    # Selection: validation only, both arms tried, each keeps its best validation accuracy.
    sel = res["selection"]
    assert sel["split"] == "validation" and {t["arm"] for t in sel["trials"]} == {
        "scratch",
        "distilled",
    }
    for arm in ("scratch", "distilled"):
        trials = [t for t in sel["trials"] if t["arm"] == arm]
        assert sel["chosen"][arm] == max(trials, key=lambda t: t["val_accuracy"])["recipe"]
    assert "test_accuracy" not in json.dumps(sel["trials"])

    # Every figure is recomputed from the per-seed accuracies.
    rows, teacher = res["per_seed"], res["teachers"]["test_accuracy"][0]
    for row in rows:
        for key in ("scratch_acc", "single_acc", "multi_acc", "peer_acc"):
            assert 0.0 <= row[key] <= 1.0
        for arm in ("single", "peer"):
            want = (
                None
                if teacher <= row["scratch_acc"]
                else ((row[f"{arm}_acc"] - row["scratch_acc"]) / (teacher - row["scratch_acc"]))
            )
            assert row[f"gap_closed_{arm}"] == (None if want is None else pytest.approx(want))
        assert row["multi_minus_single_pt"] == pytest.approx(
            100 * (row["multi_acc"] - row["single_acc"])
        )
    figs = {f["name"]: f for f in res["figures"]}
    gap = figs["gap closed, teacher A: (distilled - scratch) / (teacher - scratch)"]
    assert gap["values"] == pytest.approx(
        [r["gap_closed_single"] for r in rows if r["gap_closed_single"] is not None]
    )
    assert gap["target"] == ">= 0.9 of gap" and gap["anchor"] and "keras.io" in gap["peer"]
    multi = figs["multi (A+B) - single (A) teacher, student test accuracy"]
    assert multi["values"] == pytest.approx([r["multi_minus_single_pt"] for r in rows])
    for f in res["figures"]:  # each figure is the median of its seeds, its verdict follows from it
        assert f["repeats"] == len(f["values"]) and f["value"] == (
            pytest.approx(statistics.median(f["values"])) if f["values"] else None
        )
        if f["op"]:
            assert f["status"] == (
                "n/a"
                if f["value"] is None
                else "pass"
                if OPS[f["op"]](f["value"], f["bound"])
                else "MISS"
            ), f
    assert sum(res["teachers"]["multi_weights"]) == pytest.approx(1.0)
    assert res["peer"]["url"].startswith("https://keras.io/examples/vision/knowledge_distillation")


def test_the_committed_distillation_result_holds_together():
    check_result(committed("distillation"))
