"""Keeps benchmark B14 (bench/pipeline_parallel.py) runnable and honest: its ``--smoke`` mode end to
end, and the committed result.

Not a performance test: it checks that every cell was measured through the library
(``tfopt.runtime.gpipe.measure``), that every figure is recomputed here from the raw measurements
the JSON holds, and that each verdict follows from its number.
"""

import statistics

import pytest
from bench_checks import check_figures, committed, run_smoke

CELLS = ["2,2", "2,8", "2,16", "4,4", "4,16", "4,32", "2,16,1f1b", "4,32,1f1b"]


@pytest.mark.slow
@pytest.mark.bench
def test_pipeline_parallel_benchmark_smoke(tmp_path):
    proc, res = run_smoke("pipeline_parallel.py", tmp_path, workdir=False)
    assert "## B14: pipeline parallelism" in proc.stdout and "### Figures" in proc.stdout
    assert res["params"]["smoke"] is True
    check_result(res)


def check_result(res: dict) -> None:
    """Everything a B14 result must get right whatever its figures."""
    assert res["id"] == "B14" and res["lscpu"]["flags"]
    repeats = res["params"]["repeats"]
    assert list(res["runs"]) == CELLS and len(res["unsplit_step_seconds"]) == repeats
    assert [len(s) for s in res["partitions"].values()] == [2, 4]
    by_name = {f["name"]: f for f in res["figures"]}
    for cell in CELLS:
        k, m = map(int, cell.split(",")[:2])
        runs = res["runs"][cell]
        assert len(runs) == repeats
        for run in runs:
            assert len(run["stage_seconds"]) == k == len(run["stage_peak_bytes"])
            assert run["bubble_formula"] == pytest.approx((k - 1) / (m + k - 1))
            busy = sum(run["stage_seconds"])
            assert run["bubble_measured"] == pytest.approx(1 - busy / (k * run["step_seconds"]))
        if cell.endswith("1f1b"):
            gpipe = [r["step_peak_bytes"] for r in res["runs"][f"{k},{m}"]]
            ratio = by_name[f"K={k} M={m}: peak memory of the step, 1F1B over GPipe"]
            expected = [a / b for a, b in zip([r["step_peak_bytes"] for r in runs], gpipe) if b]
            assert ratio["values"] == pytest.approx(expected)
            continue
        gap = by_name[f"K={k} M={m}: |idle measured - (K-1)/(M+K-1)|, of the step"]
        assert gap["values"] == pytest.approx(
            [abs(r["bubble_measured"] - r["bubble_formula"]) for r in runs]
        )
    ratio = by_name["K=4 M=16: pipelined step over the unsplit step"]
    steps = [r["step_seconds"] for r in res["runs"]["4,16"]]
    expected = [a / b for a, b in zip(steps, res["unsplit_step_seconds"], strict=True)]
    assert ratio["value"] == pytest.approx(statistics.median(expected))
    exact = by_name["largest gradient difference from the unsplit model's, relative"]
    assert exact["values"] == [max(res["gradient_gap"].values())]
    budget = res["budget"]
    over = next(f for f in res["figures"] if f["name"].startswith("a model over one device's"))
    limit = budget["budget_mib"] * 2**20
    assert budget["budget_mib"] == pytest.approx(0.6 * budget["one_stage_peak_bytes"] / 2**20)
    assert "stage 1 of 1" in budget["refused"] and budget["one_stage_peak_bytes"] > limit
    trained = budget["trained"]
    fewest = min(k for k in (2, 4) if max(budget[str(k)]) <= limit)
    assert trained["stages"] == fewest and len(trained["losses"]) == 3
    assert over["values"] == [max(budget[str(fewest)]) / limit]
    check_figures(res)


def test_the_committed_pipeline_parallel_result_holds_together():
    res = committed("pipeline_parallel")
    assert res["params"]["smoke"] is False
    check_result(res)
