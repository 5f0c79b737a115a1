"""Keeps benchmark B6 (bench/distillation.py) runnable: its tiny ``--smoke`` mode, end to end.

Not a performance or accuracy test: it checks the protocol runs, prints its table and writes
well-formed JSON, never what the figures are.
"""
import json
import os
import subprocess
import sys

import pytest
from bench_checks import check_verdicts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_distillation_benchmark_smoke(tmp_path):
    out = tmp_path / "distillation.json"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "bench", "distillation.py"), "--smoke", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "| B6 distillation" in proc.stdout and "gap closed, A" in proc.stdout
    res = json.loads(out.read_text())
    assert res["params"]["smoke"] is True and len(res["per_seed"]) == res["params"]["seeds"]
    assert set(res["targets"]) == {"gap_closed_mean", "multi_minus_single_pt"}
    check_verdicts(res["targets"])
    row = res["per_seed"][0]
    for key in ("scratch_acc", "single_acc", "multi_acc"):
        assert 0.0 <= row[key] <= 1.0
    assert len(res["teachers"]["test_accuracy"]) == 2 and sum(res["teachers"]["multi_weights"]) == pytest.approx(1.0)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]
