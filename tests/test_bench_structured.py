"""Keeps benchmark B10 (bench/structured.py) runnable: its ``--smoke`` mode end to end.

Not a performance test: it checks the script trains, fine-tunes every arm through the library,
runs both tfmot peers, prints its table and writes JSON whose figures follow from its numbers.
"""

import statistics

import pytest
from bench_checks import check_figures, run_smoke


@pytest.mark.slow
def test_structured_benchmark_smoke(tmp_path):
    proc, res = run_smoke("structured.py", tmp_path)
    assert "## B10: cnn" in proc.stdout and "### Figures" in proc.stdout
    assert res["id"] == "B10" and res["params"]["smoke"] is True and res["lscpu"]["flags"]
    arms = res["families"]["cnn"]
    assert list(arms) == [
        "dense",
        "channel_prune",
        "low_rank",
        "channel_prune_latency",
        "magnitude_peer",
        "xnnpack_peer",
    ]
    # the structured arms are smaller in multiply-adds as planned; the magnitude peer keeps its shape
    assert (
        arms["channel_prune"]["macs"]
        <= 0.5 * arms["dense"]["macs"]
        < arms["magnitude_peer"]["macs"]
    )
    assert arms["channel_prune"]["section"]["checks"]["channels"]["ok"]
    assert arms["low_rank"]["macs"] <= 0.5 * arms["dense"]["macs"]
    aimed = arms["channel_prune_latency"]  # the dense p50 / 1.7, or refused below the table's floor
    if "refused" in aimed:
        assert "out of reach" in aimed["refused"]
    else:
        plan = aimed["section"]["phases"][0]["latency"]
        assert (
            plan["predicted_us"] <= plan["target_us"]
            and aimed["section"]["checks"]["channels"]["ok"]
        )
        assert aimed["macs"] < arms["dense"]["macs"]
    assert (
        arms["magnitude_peer"]["macs"] == arms["dense"]["macs"]
        and arms["magnitude_peer"]["sparsity"] > 0.05
    )
    assert (
        "Conv2D 3x3" in arms["xnnpack_peer"]["refused"]
    )  # tfmot's policy has no subgraph to prune in cnn
    cp = arms["channel_prune"]["modes"]["float32"]
    assert res["figures"][0]["value"] == pytest.approx(
        statistics.median(cp["latency_interleaved"]["xnnpack/1t"]["speedup_rounds"])
    )
    # Every timed model has its roofline; pruned to fewer multiply-adds, a lower bound.
    for name, arm in arms.items():
        for mode, row in arm.get("modes", {}).items():
            roof = row["roofline"]["xnnpack/1t"]
            assert roof["ratio"] > 1 and roof["bound_ms"] > 0, (name, mode)
    dense_bound = arms["dense"]["modes"]["float32"]["roofline"]["xnnpack/1t"]["bound_ms"]
    assert cp["roofline"]["xnnpack/1t"]["bound_ms"] < dense_bound
    check_figures(res)  # every verdict follows from its numbers
