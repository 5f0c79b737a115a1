"""Keeps benchmark B9 (bench/edge_architecture.py) runnable: its ``--smoke`` mode end to end.

Not a performance test: it checks the script runs through the folder source, the export stage
and the guide's recipes, prints its table and writes JSON whose figures follow from its numbers.
"""

import statistics

import pytest
from bench_checks import check_figures, check_roofline, committed, run_smoke

TFOPT_MODES = [
    "float32",
    "dynamic",
    "float16",
    "int8",
    "int8_auto",
    "int16x8",
    "dynamic_selective",
    "dynamic_auto",
    "int8_weights",
    "int4_weights",
]
GUIDE_MODES = ["float32", "dynamic", "float16", "int8", "int16x8"]


@pytest.mark.slow
@pytest.mark.bench
def test_edge_architecture_benchmark_smoke(tmp_path):
    proc, res = run_smoke("edge_architecture.py", tmp_path)
    assert "## B9: mobilenetv2_0.35" in proc.stdout and "### Figures" in proc.stdout
    assert res["params"]["smoke"] is True
    # the smoke slice: one width at 32x32
    assert list(res["families"]) == ["mobilenetv2_0.35"] and res["params"]["image_size"] == 32
    check_result(res)


def check_result(res: dict) -> None:
    """Everything a B9 result must get right whatever its figures (a smoke run's or a full run's)."""
    p = res["params"]
    assert res["id"] == "B9" and res["lscpu"]["flags"]
    assert list(res["families"]) == [f"mobilenetv2_{alpha:g}" for alpha in p["alphas"]]
    for name, fam in res["families"].items():
        assert fam["data"]["input"]["normalize"] == "0.5/0.5" and fam["data"]["image_shape"] == [
            p["image_size"],
            p["image_size"],
            3,
        ]
        assert len(fam["data"]["class_names"]) == 10  # Fashion-MNIST's names, through the folder
        assert list(fam["tfopt"]) == TFOPT_MODES
        assert list(fam["guide"]) == GUIDE_MODES

        def figure(part):  # the family's first figure whose name holds ``part``
            return next(
                f for f in res["figures"] if f["name"].startswith(f"{name}: ") and part in f["name"]
            )

        auto = fam["tfopt"]["int8_auto"]
        speedup = statistics.median(auto["latency_interleaved"]["xnnpack/1t"]["speedup_rounds"])
        assert figure("int8_auto speedup vs float32 (LiteRT XNNPACK, 1 thread")[
            "value"
        ] == pytest.approx(speedup)
        f32 = fam["tfopt"]["float32"]["size_bytes"]
        assert auto["size_ratio_vs_float32"] == pytest.approx(f32 / auto["size_bytes"])
        # Every model of both arms has its roofline: the bound and measured / bound at each setting.
        for arm in ("tfopt", "guide"):
            for mode, row in fam[arm].items():
                for key in ("xnnpack/1t", "xnnpack/2t"):
                    roof = row["roofline"][key]
                    p50 = statistics.median(res["latency_rounds"][f"{name}/{arm}/{mode}"][key])
                    assert roof["p50_ms"] == pytest.approx(p50), (name, arm, mode, key)
                    check_roofline(roof, res["cpu_peaks"])
        bound = fam["tfopt"]["int8_auto"]["roofline"]["xnnpack/1t"]
        ratio = figure("int8_auto p50 / compute bound")
        assert ratio["value"] == (None if bound["ratio"] is None else pytest.approx(bound["ratio"]))
        # The dynamic family's figure: the fastest of its files at least 3x smaller than float32.
        rows = fam["tfopt"]
        small = [
            m
            for m in ("dynamic", "dynamic_selective", "dynamic_auto", "int8_weights")
            if rows[m]["size_ratio_vs_float32"] >= 3
        ]
        best = max(
            small,
            key=lambda m: rows[m]["latency_interleaved"]["xnnpack/1t"]["speedup_vs_float32"],
        )
        dyn = figure("fastest dynamic-family file")
        assert dyn["detail"].startswith(best + ";"), (name, best, dyn["detail"])
        assert dyn["value"] == pytest.approx(
            statistics.median(rows[best]["latency_interleaved"]["xnnpack/1t"]["speedup_rounds"])
        )
    # the first figure is the first family's int8_auto speedup
    assert res["figures"][0]["name"].startswith(f"{next(iter(res['families']))}: int8_auto speedup")
    peaks = res["cpu_peaks"]
    assert peaks["fp32"]["gmacs"] > 0
    assert peaks["int8"]["gmacs"] > 0 if peaks["int8"] else "amx_int8" in peaks["unknown"], peaks
    check_figures(res)  # every verdict follows from its numbers


def test_the_committed_edge_architecture_result_holds_together():
    check_result(committed("edge_architecture"))
