"""Keeps the benchmarks runnable: each runs end to end in its tiny ``--smoke`` mode.

This is not a performance test: it checks that the script runs, prints its table and writes
well-formed JSON, never what the figures are.
"""

import json
import os
import statistics
import subprocess
import sys

import pytest
from bench_checks import check_verdicts, committed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.bench
def test_ingestion_benchmark_smoke(tmp_path):
    out = tmp_path / "ingestion.json"
    env = dict(
        os.environ,
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    # a subprocess: the benchmark configures TensorFlow its own way (no logical-device split)
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "bench", "ingestion.py"),
            "--smoke",
            "--workdir",
            str(tmp_path / "work"),
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
    assert "| B1 ingestion" in proc.stdout and "AUTOTUNE gap" in proc.stdout

    res = json.loads(out.read_text())
    assert res["params"]["smoke"] is True
    check_ingestion_result(res)
    assert not [
        p for p in os.listdir(tmp_path) if p.startswith(".tmp-")
    ]  # atomic write left no debris


@pytest.mark.slow
@pytest.mark.bench
def test_end_to_end_benchmark_reads_a_pipeline_run(tmp_path, pipeline_run):
    out = tmp_path / "end_to_end.json"
    env = dict(
        os.environ,
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "bench", "end_to_end.py"),
            "--run",
            pipeline_run["run"],
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
    res = json.loads(out.read_text())
    assert "| size: teacher float32 weights / chosen .tflite" in proc.stdout
    check_end_to_end_result(res)


def check_ingestion_result(res: dict) -> None:
    """Everything a B1 result must get right whatever its figures (a smoke run's or a full run's)."""
    assert res["id"] == "B1" and res["lscpu"]["flags"]
    assert (
        res["dataset"]["shards"] == 16 and res["peer"]["module"] == "bench/peers/tf_data_guide.py"
    )
    check_verdicts(res["targets"])
    figs = {f["name"]: f for f in res["figures"]}
    for f in res[
        "figures"
    ]:  # each figure is the median of its repeats, its verdict follows from it
        assert f["value"] == pytest.approx(statistics.median(f["values"])) and f["repeats"] == len(
            f["values"]
        )
        if f["op"]:
            assert f["status"] == (
                "pass"
                if {">=": f["value"] >= f["bound"], "<=": f["value"] <= f["bound"]}[f["op"]]
                else "MISS"
            )
    # the ratios are recomputed from the raw trials: best trial per side, then the ratio
    for rep in res["throughput"]["repeats"]:
        best = {
            side: max(t["epoch1_ips"] for t in trials) for side, trials in rep["trials"].items()
        }
        assert set(best) == {"naive", "naive_options_off", "guide", "tfopt"}
        assert rep["epoch1_ratio"] == pytest.approx(best["tfopt"] / best["naive"])
        assert rep["epoch1_ratio_vs_guide"] == pytest.approx(best["tfopt"] / best["guide"])
        cached = max(t["cached_ips"] for t in rep["trials"]["tfopt"])
        assert rep["cached_ratio"] == pytest.approx(
            cached / max(t["epoch2_ips"] for t in rep["trials"]["naive"])
        )
    e1 = figs["epoch 1 (cold) input throughput, tfopt / naive"]
    assert e1["values"] == [r["epoch1_ratio"] for r in res["throughput"]["repeats"]]
    assert e1["peer"].startswith("tf.data guide pipeline:") and e1["target"] == ">= 1.8x"
    for rep in res["input_bound"]["repeats"]:
        ideal, real = min(rep["ideal_step_ms_trials"]), min(rep["tfopt_step_ms_trials"])
        assert rep["tfopt_input_bound_pct"] == pytest.approx(100 * (1 - ideal / real))
    assert figs["input-bound fraction of a train step (cached epochs)"]["values"] == [
        r["tfopt_input_bound_pct"] for r in res["input_bound"]["repeats"]
    ]
    at = res["autotune"]
    assert at["best_hand"] in at["sweep_best_ips"]
    for pair in at["confirm"]:
        assert pair["gap_pct"] == pytest.approx(
            100 * (1 - max(pair["autotune_trials"]) / max(pair["best_hand_trials"]))
        )


def test_the_committed_ingestion_result_holds_together():
    check_ingestion_result(committed("ingestion"))


def check_end_to_end_result(res: dict) -> None:
    """Everything a B8 result must get right whatever its figures (read from any pipeline run)."""
    b8 = {r["name"].split(":")[0]: r for r in res["b8"]["rows"]}
    teacher, chosen = res["teacher"], res["chosen"]
    # the published ratios are the variants' own figures, recomputed here
    assert b8["latency"]["value"] == pytest.approx(teacher["p50_us"] / chosen["p50_us"], rel=1e-6)
    assert b8["size"]["value"] == pytest.approx(
        teacher["size_bytes"] / chosen["size_bytes"], rel=1e-6
    )
    assert res["lscpu"]["flags"] and res["environment"]["tensorflow"]


def test_the_committed_end_to_end_result_holds_together():
    check_end_to_end_result(committed("end_to_end"))
