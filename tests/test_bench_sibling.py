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
    assert list(arms) == ["dense", "sibling_0.5", "pruned_latency_0.5", "pruned_macs_0.5"]
    for arm in arms.values():
        assert list(arm["modes"]) == ["float32", "int8", "guide_int8"]

    def macs(name):
        return arms[name]["modes"]["float32"]["roofline"]["xnnpack/1t"]["macs"]

    # Matched to the sibling's multiply-adds: the .tflite holds about as many as the sibling's
    # (widths rounded to 8 and the unprunable stem and head keep it from matching exactly).
    assert arms["pruned_macs_0.5"]["matched"]["flops"] == pytest.approx(
        macs("sibling_0.5") / macs("dense"), rel=0.05
    )
    assert 0.8 < macs("pruned_macs_0.5") / macs("sibling_0.5") < 1.1
    latency = arms["pruned_latency_0.5"]["matched"]
    assert latency["to"] == "sibling_0.5" and latency["latency_us"] > 0 and latency["threads"] == 1
    for name, arm in arms.items():
        for mode, row in arm["modes"].items():
            n, acc = row["examples"], row["accuracy"]
            assert row["se_pt"] == pytest.approx(100 * math.sqrt(acc * (1 - acc) / n)), (name, mode)
            assert row["roofline"]["xnnpack/1t"]["ratio"] > 1, (name, mode)
    gap = next(
        f
        for f in res["figures"]
        if "multiply-adds vs" in f["name"] and "int8 accuracy" in f["name"]
    )
    want = 100 * (
        arms["pruned_macs_0.5"]["modes"]["int8"]["accuracy"]
        - arms["sibling_0.5"]["modes"]["int8"]["accuracy"]
    )
    assert gap["value"] == pytest.approx(want)
    assert set(res["verdicts"]) == {"pruned_latency_0.5", "pruned_macs_0.5"}
    check_figures(res)  # every verdict follows from its numbers


def test_verdict_reads_accuracy_against_its_error_and_speed_against_the_spread():
    from bench.sibling import verdict

    fast, slow = [1.0, 1.1, 1.05], [1.3, 1.4, 1.35]
    assert verdict(2.0, 0.6, fast, slow) == "pruned"  # more accurate and faster
    assert verdict(2.0, 0.6, [1.2, 1.3], [1.25, 1.35]) == "pruned"  # more accurate, same speed
    assert verdict(0.5, 0.6, fast, slow) == "pruned"  # as accurate, faster
    assert verdict(0.5, 0.6, slow, fast) == "sibling"  # as accurate, slower
    assert verdict(-1.0, 0.6, [1.2, 1.3], [1.25, 1.35]) == "sibling"
    assert verdict(2.0, 0.6, slow, fast) == "trade-off"  # more accurate, slower
    assert verdict(-0.3, 0.6, [1.2, 1.3], [1.25, 1.35]) == "tie"
