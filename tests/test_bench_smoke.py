"""Keeps the benchmarks runnable: each runs end to end in its tiny ``--smoke`` mode.

This is not a performance test: it checks that the script runs, prints its table and writes
well-formed JSON, never what the figures are.
"""
import json
import os
import subprocess
import sys

import pytest
from bench_checks import check_verdicts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ingestion_benchmark_smoke(tmp_path):
    out = tmp_path / "ingestion.json"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="2")
    # a subprocess: the benchmark configures TensorFlow its own way (no logical-device split)
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "bench", "ingestion.py"), "--smoke",
         "--workdir", str(tmp_path / "work"), "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "| B1 ingestion" in proc.stdout and "AUTOTUNE gap" in proc.stdout

    res = json.loads(out.read_text())
    assert res["params"]["smoke"] is True
    assert res["dataset"]["shards"] == 16
    assert all(t["measured"] is not None for t in res["targets"].values())
    check_verdicts(res["targets"])
    th = res["throughput"]  # the ratios are the throughputs' ratios
    assert th["cached_ratio"] == pytest.approx(th["tfopt_cached_ips"] / th["naive_epoch2_ips"], rel=0.35)
    assert res["throughput"]["naive_epoch1_ips"] > 0 and res["throughput"]["tfopt_cached_ips"] > 0
    assert res["input_bound"]["ideal_step_ms"] > 0
    assert res["autotune"]["best_hand"] in res["autotune"]["sweep_best_ips"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]  # atomic write left no debris


@pytest.mark.slow
def test_end_to_end_benchmark_reads_a_pipeline_run(tmp_path, pipeline_run):
    out = tmp_path / "end_to_end.json"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "bench", "end_to_end.py"), "--run", pipeline_run["run"],
                           "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    res = json.loads(out.read_text())
    assert "| size: teacher float32 weights / chosen .tflite" in proc.stdout
    b8 = {r["name"].split(":")[0]: r for r in res["b8"]["rows"]}
    teacher, chosen = res["teacher"], res["chosen"]
    # the published ratios are the variants' own figures, recomputed here
    assert b8["latency"]["value"] == pytest.approx(teacher["p50_us"] / chosen["p50_us"], rel=1e-6)
    assert b8["size"]["value"] == pytest.approx(teacher["size_bytes"] / chosen["size_bytes"], rel=1e-6)
    assert res["lscpu"]["flags"] and res["environment"]["tensorflow"]
