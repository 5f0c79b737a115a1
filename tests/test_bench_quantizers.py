"""Keeps benchmark B9q (bench/quantizers.py) runnable: its ``--smoke`` mode end to end.

Not a performance test: it checks both quantizers' exports of one trained run are timed in the
same interleaved rounds, that each row says who made its file, and that every verdict and figure
follows from the JSON's own numbers.
"""

import statistics

import pytest
from bench_checks import check_figures, committed, run_smoke


@pytest.mark.slow
@pytest.mark.bench
def test_quantizers_benchmark_smoke(tmp_path):
    proc, res = run_smoke("quantizers.py", tmp_path)
    assert "## B9q: cnn" in proc.stdout and "### Figures" in proc.stdout
    assert res["params"]["smoke"] is True and list(res["families"]) == ["cnn"]
    check_result(res)


def check_result(res: dict) -> None:
    """Everything a B9q result must get right whatever its figures (a smoke run's or a full run's)."""
    from bench import quantizers

    assert res["id"] == "B9q" and res["lscpu"]["flags"]
    assert list(res["families"]) == res["params"]["families"]
    for name, fam in res["families"].items():
        assert list(fam["rows"]) == [
            f"{arm}/{m}" for arm, modes in quantizers.ARMS.items() for m in modes
        ], name
        for key, row in fam["rows"].items():
            assert row["quantizer"] == (None if row["mode"] == "float32" else row["arm"]), (
                name,
                key,
            )
        for mode, c in fam["compare"].items():
            lit, conv = (
                res["latency_rounds"][f"{name}/{arm}/{mode}"]["xnnpack/1t"]
                for arm in ("litert", "converter")
            )
            assert c["litert_over_converter_p50"]["xnnpack/1t"] == pytest.approx(
                [a / b for a, b in zip(lit, conv)]
            ), (name, mode)
            assert c["better"] == quantizers.verdict(
                fam["rows"][f"litert/{mode}"],
                fam["rows"][f"converter/{mode}"],
                lit,
                conv,
            ), (name, mode)
        auto = fam["rows"]["litert/dynamic_auto"]
        first = next(
            f for f in res["figures"] if f["name"].startswith(f"{name}: dynamic_auto speedup")
        )
        assert first["value"] == pytest.approx(
            statistics.median(auto["latency_interleaved"]["xnnpack/1t"]["speedup_rounds"])
        ), name
    check_figures(res)


def test_the_committed_quantizers_result_holds_together():
    check_result(committed("quantizers"))


def test_the_verdict_weighs_accuracy_by_its_standard_error_then_speed_by_its_spread():
    from bench.quantizers import verdict

    def row(acc, size=1000, n=1000, agreement=0.99):
        return {
            "eval": {"accuracy": acc, "agreement": agreement, "examples": n},
            "size_bytes": size,
        }

    fast, slow = [0.8, 0.9], [1.0, 1.1]
    assert verdict(row(0.90), row(0.90), fast, slow) == "litert"  # every round faster
    assert verdict(row(0.90), row(0.90), [0.9, 1.1], [1.0, 1.05]) == "tie"  # inside the spread
    assert verdict(row(0.90), row(0.90), slow, fast) == "converter"
    assert verdict(row(0.85), row(0.90), fast, slow) == "converter"  # 5 pt > SE ~ 1.5 pt
    assert verdict(row(0.905), row(0.90), slow, fast) == "converter"  # 0.5 pt < SE: speed decides
    # as accurate, less faithful to the Keras model beyond the error (~0.4 pt): the other wins
    assert verdict(row(0.90, agreement=0.98), row(0.90), fast, slow) == "converter"
    assert (
        verdict(row(0.90, agreement=0.988), row(0.90), slow, fast) == "converter"
    )  # 0.2 pt: inside the error, speed decides
    # as accurate and as fast: the file more than 1% smaller
    assert verdict(row(0.90, 950), row(0.90), [0.9, 1.1], [1.0, 1.05]) == "litert"
    assert verdict(row(0.90, 995), row(0.90), [0.9, 1.1], [1.0, 1.05]) == "tie"
