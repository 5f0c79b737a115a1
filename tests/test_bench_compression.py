"""Keeps benchmark B4 (bench/compression.py) runnable: its --smoke mode end to end.

Not a performance test: it checks that the script runs, prints its table and writes
well-formed JSON whose sizes are consistent, never what the ratios are.
"""
import json
import os
import subprocess
import sys

import pytest
from bench_checks import check_verdicts

from optimize_fixtures import tiny_run_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_compression_benchmark_smoke(tmp_path, tmp_path_factory):
    out = tmp_path / "compression.json"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "bench", "compression.py"), "--smoke", "--from",
         tiny_run_dir(tmp_path_factory), "--workdir", str(tmp_path / "work"), "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "| B4 pruned 80% + int8 PTQ" in proc.stdout and "pass/miss" in proc.stdout

    res = json.loads(out.read_text())
    assert res["params"]["smoke"] is True and res["params"]["repeats"] == 1
    v = res["variants"]
    assert set(v) == {"float", "int8", "pruned_int8", "pqat_int8", "block_pruned_int8", "block_pqat_int8",
                      "clustered_int8", "pcqat_int8"}
    for name, row in v.items():
        assert 0.0 < row["accuracy"] <= 1.0 and row["gzip_bytes"] < row["bytes"], name
    # int8 weights are ~4x smaller; 80% zeros compress further: the ordering is physics, not tuning
    assert v["int8"]["bytes"] < v["float"]["bytes"] / 3
    assert v["pruned_int8"]["gzip_bytes"] < v["int8"]["gzip_bytes"] and v["pruned_int8"]["ratio"] > v["int8"]["ratio"]
    for name, row in v.items():  # each ratio is the float model's gzip size over the variant's
        if name != "float":
            assert row["ratio"] == pytest.approx(v["float"]["gzip_bytes"] / row["gzip_bytes"], rel=0.02), name
    assert res["targets"]["pruned_int8_ratio"]["measured"] == v["pruned_int8"]["ratio"]
    check_verdicts(res["targets"])
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]
