"""Keeps benchmark B5 (bench/tflite_ptq.py) runnable: its ``--smoke`` mode end to end.

Not a performance test: it checks the script runs, prints its tables and writes well-formed JSON
whose published figures follow from the raw numbers in it.
"""

import os
import statistics

import pytest
from bench_checks import check_verdicts, committed, run_smoke

from tfopt.export.choices import DEFAULT_MODES

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = list(DEFAULT_MODES)


@pytest.mark.slow
@pytest.mark.bench
def test_tflite_ptq_benchmark_smoke(tmp_path):
    proc, res = run_smoke("tflite_ptq.py", tmp_path)
    assert (
        "## B5 TFLite PTQ: cnn" in proc.stdout
        and "### Figures" in proc.stdout
        and "per-op timings" in proc.stdout
    )
    assert res["params"]["smoke"] is True
    check_result(res)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]


def check_result(res: dict, *, skip: frozenset = frozenset()) -> None:
    """The JSON's structure, and every published figure recomputed from the raw numbers beside it.

    ``skip`` leaves out checks that a result written by an older version of the benchmark fails:
    ``"modes"`` (each family's models are today's ``DEFAULT_MODES``) and ``"search_choice"``
    (int8_auto chose by today's rule, from the rounds at every thread count).
    """
    assert res["id"] == "B5" and res["lscpu"]["flags"]
    assert set(res["families"]) == {"cnn", "mobilenet_tiny"} and set(res["peers"]) == {
        "ptq_tutorial",
        "qat_example",
    }
    for name, fam in res["families"].items():
        rows = fam["models"]
        if "modes" not in skip:
            assert list(rows) == MODES + ["qat-int8"], name
        f32 = rows["float32"]
        for mode, row in rows.items():
            assert row["size_bytes"] > 0 and 0 < row["eval"]["agreement"] <= 1, (name, mode)
            # Sizes: float32 bytes / this model's bytes; the loss: Keras accuracy - this model's, in points.
            assert row["size_ratio_vs_float32"] == pytest.approx(
                f32["size_bytes"] / row["size_bytes"]
            )
            assert row["accuracy_loss_vs_keras_pt"] == pytest.approx(
                100 * (fam["keras_test_accuracy"] - row["eval"]["accuracy"]), abs=1e-3
            )
            for key in ("xnnpack/1t", "xnnpack/2t"):
                lat = row["latency_interleaved"][key]
                base = res["latency_rounds"][f"{name}/float32"][key]
                assert lat["rounds"] == res["latency_rounds"][f"{name}/{mode}"][key]
                assert lat["speedup_rounds"] == pytest.approx(
                    [f / v for f, v in zip(base, lat["rounds"])]
                )
        assert (
            fam["plain_sizes"]["int8"] > rows["int8"]["size_bytes"]
        )  # --strip-strings saved bytes
        auto = rows["int8_auto"]["auto"]
        assert auto["slow"] == [t["node"] for t in auto["ops"] if t["slower_in_int8"]]
        assert rows["int8_auto"]["float_nodes"] == auto["candidates"][auto["chosen"]]["float_nodes"]
        check_search(auto, choice="search_choice" not in skip)
        for q in fam["qat"]:
            assert q["loss_pt"] == pytest.approx(
                100 * (q["control_keras_accuracy"] - q["qat_tflite_accuracy"]), abs=1e-3
            )
        check_verdicts(res["targets"][name])
        t = res["targets"][name]
        assert (
            t["int8_auto_speedup_1t"]["measured"]
            == rows["int8_auto"]["latency_interleaved"]["xnnpack/1t"]["speedup_vs_float32"]
        )
        assert t["int8_auto_size_ratio"]["measured"] == rows["int8_auto"]["size_ratio_vs_float32"]
    for peer in res["peers"].values():
        assert peer["int8_size_ratio"] == pytest.approx(
            peer["float32"]["size_bytes"] / peer["int8"]["size_bytes"]
        )
    # Every published figure: its value is the median of its values, its verdict follows from it.
    names = [f["name"] for f in res["figures"]]
    assert "cnn: int8_auto speedup vs float32 (LiteRT XNNPACK, 1 thread, batch 1)" in names
    for f in res["figures"]:
        assert f["values"], f["name"]
        assert f["value"] == pytest.approx(statistics.median(f["values"]))
        if f["op"]:
            passed = f["value"] >= f["bound"] if f["op"] == ">=" else f["value"] <= f["bound"]
            assert f["status"] == ("pass" if passed else "MISS"), f
    speed = next(
        f
        for f in res["figures"]
        if f["name"].startswith("mobilenet_tiny: int8_auto speedup vs float32 (L")
    )
    assert speed["values"] == res["families"]["mobilenet_tiny"]["models"]["int8_auto"][
        "latency_interleaved"
    ]["xnnpack/1t"]["speedup_rounds"] and speed["peer"].startswith('TF "Post-training')


def test_the_committed_tflite_ptq_result_holds_together():
    # bench/results/tflite_ptq.json predates DEFAULT_MODES' dynamic_auto (its rows hold "dynamic")
    # and int8_auto's per-thread-count search rounds (no "p50_rounds_by_threads"): until B5 is
    # re-run, those two checks run on the smoke test's JSON only.
    check_result(committed("tflite_ptq"), skip=frozenset({"modes", "search_choice"}))


def check_search(auto: dict, choice: bool = True) -> None:
    """int8_auto's search by its mechanism, whatever a loaded machine timed: every op and every
    candidate timed with one protocol (the same number of rounds), no candidate keeps every
    quantized op in float (the quantization debugger cannot build it), plain int8 first, and the
    chosen one plain int8 unless a passing candidate beat it in every round at every thread count
    (then the fastest such; the fastest passing one when plain int8 failed the gate; the best
    agreement when none passed). ``choice=False`` leaves out the last (the chosen candidate)."""
    rounds = {len(t["float_rounds"]) for t in auto["ops"] if t["float_rounds"]}
    rounds |= {len(t["int8_rounds"]) for t in auto["ops"] if t["float_rounds"]}
    rounds |= {len(c["p50_rounds"]) for c in auto["candidates"]}
    assert len(rounds) == 1 and rounds.pop() >= 1, auto
    cands, chosen = auto["candidates"], auto["chosen"]
    quantized = {t["node"] for t in auto["ops"] if t["denylistable"]}
    assert cands[0]["float_nodes"] == [] and not any(
        quantized <= set(c["float_nodes"]) for c in cands[1:]
    )
    medians = [statistics.median(c["p50_rounds"]) for c in cands]
    assert all(c["p50_ms"] == pytest.approx(m) for c, m in zip(cands, medians))
    if not choice:
        return
    passing = [i for i, c in enumerate(cands) if c["gate"]["passed"]]
    by_threads = [c["p50_rounds_by_threads"] for c in cands]

    def total(i):
        return sum(statistics.median(r) for r in by_threads[i].values())

    if passing and 0 in passing:
        # A candidate replaces plain int8 only when every round of it beats every round of plain
        # int8 at every thread count (beyond the measured noise); then the fastest such.
        beaters = [
            i
            for i in passing
            if i and all(max(r) < min(by_threads[0][t]) for t, r in by_threads[i].items())
        ]
        assert chosen == (min(beaters, key=total) if beaters else 0)
    elif passing:
        assert chosen == min(passing, key=total)
    else:
        agreement = [c["result"]["agreement"] or 0.0 for c in cands]
        assert agreement[chosen] == max(agreement)
