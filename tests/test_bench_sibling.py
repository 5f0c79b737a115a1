"""Keeps benchmark B11 (bench/sibling.py) runnable: its ``--smoke`` mode end to end.

Not a performance test: it checks the script prunes and distils the dense model, trains the
sibling, exports and times every arm, and writes JSON whose figures follow from its numbers.
"""

import math

import pytest
from bench_checks import check_figures, run_smoke


@pytest.mark.slow
def test_sibling_benchmark_smoke(tmp_path):
    proc, res = run_smoke("sibling.py", tmp_path)
    assert "## B11: channel-pruned MobileNetV2 1.0" in proc.stdout and "### Figures" in proc.stdout
    assert res["id"] == "B11" and res["params"]["smoke"] is True and res["lscpu"]["flags"]
    arms = res["arms"]
    assert list(arms) == ["dense", "pruned_0.5", "sibling_0.5"]
    for arm in arms.values():
        assert list(arm["modes"]) == ["float32", "int8", "guide_int8"]
    dense, pruned = arms["dense"]["modes"]["float32"], arms["pruned_0.5"]["modes"]["float32"]
    # Pruned to half the FLOPs: about half the multiply-adds the .tflite holds, so half the bound.
    ratio = pruned["roofline"]["xnnpack/1t"]["macs"] / dense["roofline"]["xnnpack/1t"]["macs"]
    assert 0.35 < ratio <= 0.55, ratio
    for name, arm in arms.items():
        for mode, row in arm["modes"].items():
            n, acc = row["examples"], row["accuracy"]
            assert row["se_pt"] == pytest.approx(100 * math.sqrt(acc * (1 - acc) / n)), (name, mode)
            assert row["roofline"]["xnnpack/1t"]["ratio"] > 1, (name, mode)
    gap = next(f for f in res["figures"] if "int8 accuracy difference" in f["name"])
    want = 100 * (
        arms["pruned_0.5"]["modes"]["int8"]["accuracy"]
        - arms["sibling_0.5"]["modes"]["int8"]["accuracy"]
    )
    assert gap["value"] == pytest.approx(want)
    check_figures(res)  # every verdict follows from its numbers
