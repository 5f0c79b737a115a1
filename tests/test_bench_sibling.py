"""Keeps benchmark B11 (bench/sibling.py) runnable: its ``--smoke`` mode end to end.

Not a performance test: it checks the script prunes and distils the dense model, trains the
sibling, exports and times every arm, and writes JSON whose figures follow from its numbers.
"""

import math

import pytest
from bench_checks import check_figures, check_roofline, committed, run_smoke


@pytest.mark.slow
@pytest.mark.bench
def test_sibling_benchmark_smoke(tmp_path):
    proc, res = run_smoke("sibling.py", tmp_path)
    assert "## B11: channel-pruned MobileNetV2 1.0" in proc.stdout and "### Figures" in proc.stdout
    assert res["params"]["smoke"] is True
    # the smoke slice: one sibling (alpha 0.5), both matches
    assert list(res["arms"]) == ["dense", "sibling_0.5", "pruned_latency_0.5", "pruned_macs_0.5"]
    check_result(res)


def check_result(res: dict) -> None:
    """Everything a B11 result must get right whatever its figures (a smoke run's or a full run's)."""
    p = res["params"]
    assert res["id"] == "B11" and res["lscpu"]["flags"]
    arms = res["arms"]
    # the dense model, then per sibling width: the sibling and one pruned arm per match
    pruned = [f"pruned_{match}_{alpha:g}" for alpha in p["alphas"] for match in p["matches"]]
    assert list(arms) == ["dense"] + [
        name
        for alpha in p["alphas"]
        for name in (f"sibling_{alpha:g}", *(f"pruned_{m}_{alpha:g}" for m in p["matches"]))
    ]
    for arm in arms.values():
        assert list(arm["modes"]) == ["float32", "int8", "guide_int8"]

    def macs(name):
        return arms[name]["modes"]["float32"]["roofline"]["xnnpack/1t"]["macs"]

    for alpha in p["alphas"]:
        sibling = f"sibling_{alpha:g}"
        if "macs" in p["matches"]:
            # Matched to the sibling's multiply-adds: the .tflite holds about as many as the
            # sibling's (widths rounded to 8 and the unprunable stem and head keep it from
            # matching exactly).
            name = f"pruned_macs_{alpha:g}"
            assert arms[name]["matched"]["flops"] == pytest.approx(
                macs(sibling) / macs("dense"), rel=0.05
            ), name
            assert 0.8 < macs(name) / macs(sibling) < 1.1, name
            gap = next(
                f
                for f in res["figures"]
                if f["name"].startswith(f"pruned to alpha {alpha:g}'s ")
                and "multiply-adds vs" in f["name"]
                and "int8 accuracy" in f["name"]
            )
            want = 100 * (
                arms[name]["modes"]["int8"]["accuracy"] - arms[sibling]["modes"]["int8"]["accuracy"]
            )
            assert gap["value"] == pytest.approx(want), name
        if "latency" in p["matches"]:
            latency = arms[f"pruned_latency_{alpha:g}"]["matched"]
            assert (
                latency["to"] == sibling and latency["latency_us"] > 0 and latency["threads"] == 1
            ), alpha
            if latency.get("unreachable"):  # pruned to the nearest target instead, and said so
                assert "out of reach" in latency["unreachable"], alpha
                assert latency["latency_us"] > latency["sibling_latency_us"], alpha
                gap = next(f for f in res["figures"] if f"alpha {alpha:g}'s float p50" in f["name"])
                assert "out of reach" in gap["detail"], alpha
    for name, arm in arms.items():
        for mode, row in arm["modes"].items():
            n, acc = row["examples"], row["accuracy"]
            assert row["se_pt"] == pytest.approx(100 * math.sqrt(acc * (1 - acc) / n)), (name, mode)
            check_roofline(row["roofline"]["xnnpack/1t"], res["cpu_peaks"])
    assert set(res["verdicts"]) == set(pruned)
    check_figures(res)  # every verdict follows from its numbers


def test_the_committed_sibling_result_holds_together():
    check_result(committed("sibling"))


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
