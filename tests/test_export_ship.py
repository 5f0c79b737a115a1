"""Which exported file is shipped: the fastest at one thread among those whose gate passed."""

from tfopt.export import ship


def _row(mode, p50, passed=True, size=1000, acc=0.9):
    return {
        "mode": mode,
        "file": f"model_{mode}.tflite",
        "io": "float",
        "size_bytes": size,
        "metadata_bytes": 24,
        "eval": {"accuracy": acc},
        "gate": {"passed": passed, "reasons": [] if passed else ["agreement 0.5 < 0.99"]},
        "latency": {"xnnpack/2t": {"p50_ms": p50 / 3}, "xnnpack/1t": {"p50_ms": p50}},
    }


def test_the_fastest_passing_file_at_one_thread_is_shipped():
    rows = [_row("float32", 1.0), _row("int8", 0.2, passed=False), _row("dynamic", 0.5)]
    assert ship.choose(rows)["mode"] == "dynamic"
    # a tie in speed goes to the smaller file
    rows.append(_row("int8_weights", 0.5, size=500))
    assert ship.choose(rows)["mode"] == "int8_weights"
    # one thread decides, not two
    rows.append(
        {
            **_row("float16", 0.6),
            "latency": {"xnnpack/1t": {"p50_ms": 0.6}, "xnnpack/2t": {"p50_ms": 0.01}},
        }
    )
    assert ship.choose(rows)["mode"] == "int8_weights"


def test_nothing_is_shipped_when_every_gate_failed_and_the_line_says_it_all():
    assert ship.choose([_row("int8", 0.2, passed=False)]) is None
    described = ship.describe(_row("int8", 0.2), "AMD EPYC")
    assert described["kib"] == round(1024 / 1024, 1)
    text = ship.line(described, "/runs/x")
    assert text == (
        "ship: /runs/x/model.tflite (int8, 1 KiB, accuracy 90.0%, p50 0.200 ms on AMD EPYC; "
        "a copy of model_int8.tflite)"
    )


def test_a_failed_gate_names_the_next_step_and_says_what_was_written():
    from tfopt.export.cli import _next_step

    shipped = {"ship": {"file": "model.tflite", "from": "model_float32.tflite"}}
    text = _next_step({"int8": "agreement 0.95 < 0.99"}, shipped)
    assert "model.tflite is model_float32.tflite, which passed" in text
    for flag in ("--modes int8_auto", "--float-layers", "--min-agreement"):
        assert flag in text, flag
    text = _next_step({"float32": "agreement 0.5 < 0.99"}, {"ship": None})
    assert "no model.tflite was written" in text and "--float-layers" not in text
