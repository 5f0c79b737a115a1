"""Keeps benchmark B9 (bench/edge_architecture.py) runnable: its ``--smoke`` mode end to end.

Not a performance test: it checks the script runs through the folder source, the export stage
and the guide's recipes, prints its table and writes JSON whose figures follow from its numbers.
"""

import statistics

import pytest
from bench_checks import check_figures, run_smoke


@pytest.mark.slow
def test_edge_architecture_benchmark_smoke(tmp_path):
    proc, res = run_smoke("edge_architecture.py", tmp_path)
    assert "## B9: mobilenetv2_0.35" in proc.stdout and "### Figures" in proc.stdout
    assert res["id"] == "B9" and res["params"]["smoke"] is True and res["lscpu"]["flags"]
    fam = res["families"]["mobilenetv2_0.35"]
    assert fam["data"]["input"]["normalize"] == "0.5/0.5" and fam["data"]["image_shape"] == [
        32,
        32,
        3,
    ]
    assert len(fam["data"]["class_names"]) == 10  # Fashion-MNIST's names, through the folder
    assert list(fam["tfopt"]) == [
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
    assert list(fam["guide"]) == ["float32", "dynamic", "float16", "int8", "int16x8"]
    auto = fam["tfopt"]["int8_auto"]
    speedup = statistics.median(auto["latency_interleaved"]["xnnpack/1t"]["speedup_rounds"])
    assert res["figures"][0]["value"] == pytest.approx(speedup)
    f32 = fam["tfopt"]["float32"]["size_bytes"]
    assert auto["size_ratio_vs_float32"] == pytest.approx(f32 / auto["size_bytes"])
    # Every model of both arms has its roofline: the bound and measured / bound at each setting.
    for arm in ("tfopt", "guide"):
        for mode, row in fam[arm].items():
            for key in ("xnnpack/1t", "xnnpack/2t"):
                roof = row["roofline"][key]
                p50 = statistics.median(
                    res["latency_rounds"][f"mobilenetv2_0.35/{arm}/{mode}"][key]
                )
                assert roof["p50_ms"] == pytest.approx(p50) and roof["ratio"] > 1, (arm, mode, key)
    bound = fam["tfopt"]["int8_auto"]["roofline"]["xnnpack/1t"]
    ratio = next(f for f in res["figures"] if "int8_auto p50 / compute bound" in f["name"])
    assert ratio["value"] == pytest.approx(bound["ratio"]) and res["cpu_peaks"]["int8"]["gmacs"] > 0
    # The dynamic family's figure: the fastest of its files at least 3x smaller than float32.
    rows = fam["tfopt"]
    small = [
        m
        for m in ("dynamic", "dynamic_selective", "dynamic_auto", "int8_weights")
        if rows[m]["size_ratio_vs_float32"] >= 3
    ]
    best = max(
        small, key=lambda m: rows[m]["latency_interleaved"]["xnnpack/1t"]["speedup_vs_float32"]
    )
    dyn = next(f for f in res["figures"] if "fastest dynamic-family file" in f["name"])
    assert dyn["detail"].startswith(best + ";"), (best, dyn["detail"])
    assert dyn["value"] == pytest.approx(
        statistics.median(rows[best]["latency_interleaved"]["xnnpack/1t"]["speedup_rounds"])
    )
    check_figures(res)  # every verdict follows from its numbers
