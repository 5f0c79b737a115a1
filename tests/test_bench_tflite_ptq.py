"""Keeps benchmark B5 (bench/tflite_ptq.py) runnable: its ``--smoke`` mode end to end.

Not a performance test: it checks the script runs, prints its tables and writes well-formed JSON.
"""
import json
import os
import subprocess
import sys

import pytest
from bench_checks import check_verdicts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_tflite_ptq_benchmark_smoke(tmp_path):
    out = tmp_path / "tflite_ptq.json"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "bench", "tflite_ptq.py"), "--smoke", "--no-litert", "--no-qat",
         "--workdir", str(tmp_path / "work"), "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "## B5 TFLite PTQ" in proc.stdout and "### Targets" in proc.stdout and "int8_speedup" in proc.stdout

    res = json.loads(out.read_text())
    assert res["params"]["smoke"] is True
    assert set(res["models"]) == {"float32", "dynamic", "float16", "int8", "int16x8", "int8+float:conv0"}
    for name, row in res["models"].items():
        assert row["size_bytes"] > 0 and 0 < row["eval"]["agreement"] <= 1, name
        assert row["latency"]["xnnpack/1t"]["p50_ms"] > 0, name
    # Each mode's speedup is float32's p50 over its own (medians of per-round ratios: close to the ratio of medians).
    f32 = res["models"]["float32"]["latency"]["xnnpack/1t"]["p50_ms"]
    for name, row in res["models"].items():
        lat = row["latency"]["xnnpack/1t"]
        assert lat["speedup_vs_float32"] == pytest.approx(f32 / lat["p50_ms"], rel=0.35), name
    assert res["targets"]["qat_int8_accuracy_loss_pt"]["measured"] is None  # --no-qat (QAT: test_export.py)
    assert res["targets"]["int8_speedup_xnnpack_1t"]["measured"] == res["models"]["int8"]["latency"]["xnnpack/1t"][
        "speedup_vs_float32"]
    check_verdicts(res["targets"])
    assert [r["layer"] for r in res["layer_kernels"]] == ["conv0", "conv1", "fc", "logits"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]
