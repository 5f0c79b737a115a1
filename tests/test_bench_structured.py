"""Keeps benchmark B10 (bench/structured.py) runnable: its ``--smoke`` mode end to end.

Not a performance test: it checks the script trains, fine-tunes every arm through the library,
runs both tfmot peers, prints its table and writes JSON whose figures follow from its numbers.
"""

import statistics

import pytest
from bench_checks import check_figures, check_roofline, committed, run_smoke

ARMS = [
    "dense",
    "channel_prune",
    "low_rank",
    "channel_prune_latency",
    "magnitude_peer",
    "xnnpack_peer",
]


@pytest.mark.slow
@pytest.mark.bench
def test_structured_benchmark_smoke(tmp_path):
    proc, res = run_smoke("structured.py", tmp_path)
    assert "## B10: cnn" in proc.stdout and "### Figures" in proc.stdout
    assert res["params"]["smoke"] is True and list(res["families"]) == ["cnn"]
    check_result(res)


def check_result(res: dict) -> None:
    """Everything a B10 result must get right whatever its figures (a smoke run's or a full run's)."""
    p = res["params"]
    assert res["id"] == "B10" and res["lscpu"]["flags"]
    assert list(res["families"]) == p["families"]
    low_rank_flops = dict(p["low_rank_flops"])
    for family, arms in res["families"].items():
        assert list(arms) == ARMS, family
        # the structured arms are smaller in multiply-adds as planned; the magnitude peer keeps its shape
        assert (
            arms["channel_prune"]["macs"]
            <= p["flops"] * arms["dense"]["macs"]
            < arms["magnitude_peer"]["macs"]
        ), family
        assert arms["channel_prune"]["section"]["checks"]["channels"]["ok"], family
        assert arms["low_rank"]["macs"] <= low_rank_flops[family] * arms["dense"]["macs"], family
        aimed = arms[
            "channel_prune_latency"
        ]  # the dense p50 / 1.7, or refused below the table's floor
        if "refused" in aimed:
            assert "out of reach" in aimed["refused"], family
        else:
            plan = aimed["section"]["phases"][0]["latency"]
            assert (
                plan["predicted_us"] <= plan["target_us"]
                and aimed["section"]["checks"]["channels"]["ok"]
            ), family
            assert aimed["macs"] < arms["dense"]["macs"], family
        assert (
            arms["magnitude_peer"]["macs"] == arms["dense"]["macs"]
            and arms["magnitude_peer"]["sparsity"] > 0.05
        ), family
        if family == "cnn":  # tfmot's policy has no subgraph to prune in cnn
            assert "Conv2D 3x3" in arms["xnnpack_peer"]["refused"]
        cp = arms["channel_prune"]["modes"]["float32"]
        speedup = next(
            f
            for f in res["figures"]
            if f["name"].startswith(f"{family}: channel_prune to half the FLOPs, float .tflite")
        )
        assert speedup["value"] == pytest.approx(
            statistics.median(cp["latency_interleaved"]["xnnpack/1t"]["speedup_rounds"])
        ), family
        # Every timed model has its roofline; pruned to fewer multiply-adds, a lower bound.
        for arm in arms.values():
            for row in arm.get("modes", {}).values():
                check_roofline(row["roofline"]["xnnpack/1t"], res["cpu_peaks"])
        dense_bound = arms["dense"]["modes"]["float32"]["roofline"]["xnnpack/1t"]["bound_ms"]
        assert cp["roofline"]["xnnpack/1t"]["bound_ms"] < dense_bound, family
    # the first figure is the first family's channel_prune speedup
    assert res["figures"][0]["name"].startswith(
        f"{p['families'][0]}: channel_prune to half the FLOPs, float .tflite"
    )
    check_figures(res)  # every verdict follows from its numbers


def test_the_committed_structured_result_holds_together():
    check_result(committed("structured"))
