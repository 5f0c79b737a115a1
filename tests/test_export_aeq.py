"""Modes quantized by ai-edge-quantizer: which ops each recipe touches, that every op of
dynamic_selective stays on XNNPACK where the converter's dynamic mode leaves depthwise behind, a
recipe file re-applied byte for byte, int8_auto's choice as a recipe, and the one-line refusals."""

import json
import os
import subprocess
import sys
from importlib import metadata

from tfopt.core._keras import keras

import numpy as np
import pytest
from bench_checks import check_roofline

from tfopt.core import peaks
from tfopt.core.errors import ConfigError
from tfopt.export import aeq, auto, benchmark, fidelity, ops, summary, tflite
from tfopt.export.cli import main as export_main
from tfopt.export.evaluate import EvalResult, TFLiteModel, read_tflite
from tfopt.export.runner import BenchSettings, ExportSettings
from tfopt.export.runner import run as export_run


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    # Every weighted layer holds over 1,024 weights: the converter's dynamic mode skips smaller ones.
    x = keras.layers.Conv2D(128, 3, padding="same", activation="relu", name="stem")(inputs)
    x = keras.layers.DepthwiseConv2D(3, padding="same", activation="relu", name="dw")(x)
    x = keras.layers.Conv2D(64, 1, activation="relu", name="project")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(20, name="logits")(x))


def _close(got, want, share: float = 0.05):
    """Within ``share`` of the outputs' range: what a quantized model of random weights keeps."""
    assert np.abs(got - want).max() <= share * np.abs(want).max(), np.abs(got - want).max()


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(1).random((16, 16, 16, 3), dtype=np.float32)


def _weights(content: bytes | str) -> dict[str, set[str]]:
    """Op name -> the arithmetic of its weights (int8 or fp32), from the flatbuffer."""
    content = read_tflite(content) if isinstance(content, str) else content
    out: dict[str, set[str]] = {}
    for c in ops.op_costs(content):
        if c.macs:
            out.setdefault(c.op, set()).add(c.arithmetic)
    return out


def _float16_elements(content: bytes) -> int:
    from ai_edge_litert.interpreter import Interpreter

    details = Interpreter(model_content=content).get_tensor_details()
    return sum(int(np.prod(d["shape"])) for d in details if d["dtype"] == np.float16)


def test_dynamic_selective_keeps_depthwise_float_and_every_op_on_xnnpack(model, x):
    selective = tflite.convert(model, "dynamic_selective").content
    assert _weights(selective) == {
        "CONV_2D": {"int8"},
        "DEPTHWISE_CONV_2D": {"fp32"},
        "FULLY_CONNECTED": {"int8"},
    }
    kernels = benchmark.kernel_report(TFLiteModel(selective))
    assert kernels["builtin_kernel_ops"] == [] or kernels["builtin_kernel_ops"] == ["SOFTMAX"]
    assert "DEPTHWISE_CONV_2D" not in kernels["builtin_kernel_ops"]
    # The converter's dynamic range quantizes depthwise too, and XNNPACK leaves it to LiteRT.
    dynamic = tflite.convert(model, "dynamic").content
    assert _weights(dynamic)["DEPTHWISE_CONV_2D"] == {"int8"}
    assert (
        "DEPTHWISE_CONV_2D" in benchmark.kernel_report(TFLiteModel(dynamic))["builtin_kernel_ops"]
    )
    _close(TFLiteModel(selective).predict(x), model.predict(x, verbose=0))


@pytest.mark.parametrize("mode", ["dynamic", "float16", "int8", "int16x8"])
def test_litert_quantizer_makes_the_converter_modes_from_the_float_model(model, x, mode):
    from tfopt.export.tflite import ConvertOptions

    litert = tflite.convert(
        model, mode, calibration=[x], options=ConvertOptions(quantizer="litert")
    )
    converter = tflite.convert(
        model, mode, calibration=[x], options=ConvertOptions(quantizer="converter")
    )
    assert (litert.quantizer, converter.quantizer) == ("litert", "converter")
    assert tflite.convert(model, mode, calibration=[x]).quantizer == "converter"  # B9q's default
    assert litert.recipe == aeq.named_recipe(mode) and converter.recipe is None
    assert litert.content != converter.content and litert.io == "float"
    # the same arithmetic per op as the converter's model of that mode, and the same outputs
    assert _weights(litert.content) == _weights(converter.content)
    if mode == "float16":  # every kernel stored in float16 by both
        kernels = sum(int(np.prod(w.shape)) for w in model.weights if "kernel" in w.name)
        assert _float16_elements(litert.content) >= kernels
        assert _float16_elements(converter.content) >= kernels
    want = model.predict(x, verbose=0)
    _close(TFLiteModel(litert.content).predict(x), want)
    _close(TFLiteModel(converter.content).predict(x), want)


def test_the_quantizer_choice_is_checked_in_one_line():
    from tfopt.export.tflite import ConvertOptions

    with pytest.raises(
        ConfigError, match="unknown quantizer 'tflite'; choose one of converter, litert"
    ):
        ConvertOptions(quantizer="tflite")
    with pytest.raises(
        ConfigError,
        match="--io int8 is the converter's: tfopt's LiteRT Quantizer recipes keep float",
    ):
        ConvertOptions(quantizer="litert", io="int8")


def test_weight_only_modes_dequantize_to_float_and_int4_is_smaller(model, x):
    float32 = tflite.convert(model, "float32").content
    int8w = tflite.convert(model, "int8_weights")
    int4w = tflite.convert(model, "int4_weights")
    for conv in (int8w, int4w):
        names = [op for op, _ in ops.model_ops(conv.content)]
        assert "DEQUANTIZE" in names and conv.io == "float"
        assert conv.recipe == aeq.named_recipe(conv.mode)
    assert len(int4w.content) < len(int8w.content) < len(float32) / 2.5  # biases stay float
    want = model.predict(x, verbose=0)
    _close(TFLiteModel(int8w.content).predict(x), want)
    _close(TFLiteModel(int4w.content).predict(x), want, share=0.3)


def test_a_recipe_file_reapplies_byte_for_byte(model, tmp_path):
    selective = tflite.convert(model, "dynamic_selective")
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(selective.recipe))
    again = tflite.convert(model, "recipe", options=tflite.ConvertOptions(recipe=str(path)))
    assert again.content == selective.content and again.recipe == selective.recipe


def test_int8_autos_choice_as_a_recipe_keeps_exactly_those_ops_float(model, x):
    float32 = tflite.convert(model, "float32").content
    names = ops.model_ops(float32)
    dw = next(n for n in names if n[0] == "DEPTHWISE_CONV_2D")
    timings = [auto.OpTiming(index=i, op=op, node=node) for i, (op, node) in enumerate(names)]
    gate = fidelity.GateResult(True, [])
    result = EvalResult(examples=1, accuracy=1.0, keras_accuracy=1.0, agreement=1.0)
    candidates = [auto.Candidate([dw[1]], 1, [0.1], result, gate)]
    recipe = auto.recipe(auto.AutoResult(threads=1, ops=timings, candidates=candidates, chosen=0))
    assert recipe[-1]["regex"] == f"^{__import__('re').escape(dw[1] + ';')}$"
    content = aeq.quantize(float32, json.loads(json.dumps(recipe)), calibration=[x], where="auto")
    costs = [c for c in ops.op_costs(content) if c.macs]
    assert [(c.op, c.arithmetic, c.activations) for c in costs] == [
        ("CONV_2D", "int8", "int8"),
        ("DEPTHWISE_CONV_2D", "fp32", "float32"),
        ("CONV_2D", "int8", "int8"),
        ("FULLY_CONNECTED", "int8", "int8"),
    ]
    assert TFLiteModel(content).input_dtype == np.int8  # ai-edge-quantizer's static int8 I/O
    _close(TFLiteModel(content).predict(x), model.predict(x, verbose=0), share=0.1)


def test_recipe_mistakes_are_one_line_errors(model, tmp_path):
    names = ops.model_ops(tflite.convert(model, "float32").content)
    with pytest.raises(ConfigError, match=r"entry 1 names BATCH_MATMUL ops matching '\.\*', which"):
        aeq.check_recipe([{"regex": ".*", "operation": "BATCH_MATMUL"}], names, "r.json")
    bad = tmp_path / "bad.json"
    for text, needle in (
        ("{", "is not JSON"),
        ("[]", "holds no entries"),
        ('[{"regex": ".*"}]', "entry 1 has no operation"),
        ('[{"regex": "(", "operation": "*"}]', "is not a regular expression"),
    ):
        bad.write_text(text)
        with pytest.raises(ConfigError, match=needle):
            aeq.read_recipe(str(bad))
    unsupported = [aeq._entry("DEPTHWISE_CONV_2D", aeq.weight_only(4))]
    bad.write_text(json.dumps(unsupported))
    with pytest.raises(
        ConfigError, match="ai-edge-quantizer refused the recipe: Unsupported op"
    ) as e:
        tflite.convert(model, "recipe", options=tflite.ConvertOptions(recipe=str(bad)))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "version, needle",
    [
        (
            None,
            "ai-edge-quantizer (>=0.10,<0.11), which is not installed; tfopt depends on it: pip "
            "install 'ai-edge-quantizer>=0.10,<0.11'",
        ),
        (
            "0.9.0",
            "ai-edge-quantizer 0.9.0 is installed; tfopt needs ai-edge-quantizer>=0.10,<0.11",
        ),
    ],
)
def test_a_missing_or_out_of_range_quantizer_is_named_with_the_extra(monkeypatch, version, needle):
    def fake(name):
        if version is None:
            raise metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(aeq.metadata, "version", fake)
    with pytest.raises(ConfigError) as e:
        aeq.require()
    assert needle in str(e.value)


def test_the_cli_refuses_a_recipe_mode_without_its_file_before_anything_is_written(
    tmp_path, capsys
):
    out = tmp_path / "out"
    argv = ["--from", str(tmp_path), "--modes", "recipe", "-o", str(out)]
    assert export_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "tfopt export: error: --modes recipe quantizes as a recipe file says; give --recipe FILE.json"
    ]
    assert export_main([*argv[:4], "--recipe", str(tmp_path / "none.json")]) == 2
    assert "cannot read --recipe" in capsys.readouterr().err
    assert not os.path.exists(out)


def test_export_writes_each_quantizer_mode_gated_timed_and_with_its_recipe(mnist_run, tmp_path):
    from tfopt.export.tflite import ConvertOptions

    settings = ExportSettings(
        modes=("float32", "dynamic_selective", "int8_weights", "int8", "float16", "dynamic_auto"),
        options=ConvertOptions(quantizer="litert"),
        eval_limit=300,
        bench=BenchSettings(threads=(1,), runs=5, warmup=1, keras=False),
        plot=False,
    )
    out = tmp_path / "out"
    record = export_run(mnist_run, settings, out_dir=str(out))
    rows = {r["mode"]: r for r in record.section["modes"]}
    for mode in ("dynamic_selective", "int8_weights"):
        row = rows[mode]
        assert row["gate"]["passed"] and row["eval"]["agreement"] >= 0.99, row["eval"]
        assert json.loads((out / row["recipe"]).read_text()) == aeq.named_recipe(mode)
        assert record.artifacts[f"{mode}_recipe"] == f"model_{mode}_recipe.json"
        check_roofline(row["roofline"]["xnnpack/1t"], peaks())
        assert row["size_bytes"] < rows["float32"]["size_bytes"] / 3
    assert _weights(str(out / rows["dynamic_selective"]["file"])) == {
        "CONV_2D": {"int8"},
        "FULLY_CONNECTED": {"int8"},
    }
    # who quantized each file, in run.json and in the file's own metadata
    made_by = {"float32": None, "float16": "litert", "int8": "litert", "int8_weights": "litert",
               "dynamic_auto": "litert"}  # fmt: skip
    for mode, quantizer in made_by.items():
        assert rows[mode]["quantizer"] == quantizer, mode
        content = (out / rows[mode]["file"]).read_bytes()
        assert (b"quantized by LiteRT Quantizer" in content) == (quantizer == "litert"), mode
        assert (b"quantized by the TFLite converter" in content) == (quantizer == "converter")
    assert json.loads((out / rows["int8"]["recipe"]).read_text()) == aeq.named_recipe("int8")
    # dynamic_auto: its per-op choice is the recipe written beside it, said in the notes
    auto_recipe = json.loads((out / rows["dynamic_auto"]["recipe"]).read_text())
    assert auto_recipe[0] == aeq.named_recipe("dynamic")[0]
    assert any(
        n.startswith("dynamic_auto: int8 arithmetic slower") for n in rows["dynamic_auto"]["notes"]
    )
    assert rows["dynamic_auto"]["size_bytes"] < rows["float32"]["size_bytes"] / 3


def _timed(mode, p50, builtin=(), spread=0.02):
    return {
        "mode": mode,
        "latency": {
            "xnnpack/1t": {"p50_ms": p50, "round_p50_ms": [p50 * (1 - spread), p50 * (1 + spread)]},
            "xnnpack/2t": {"p50_ms": p50 / 2},
        },
        "kernels": {"builtin_kernel_ops": list(builtin)},
    }


HOST = "AMD EPYC, x86-64 AVX-512 VNNI"


def test_a_mode_slower_than_float_says_so_with_the_ratio_and_the_faster_choice():
    rows = [
        _timed("float32", 1.0),
        _timed("dynamic", 2.7, ["DEPTHWISE_CONV_2D", "SOFTMAX"]),
        _timed("dynamic_auto", 0.61),
        _timed("float16", 1.05),  # within the noise margin: no word
        _timed("int8", 0.5),
        _timed("int16x8", 42.0, ["ADD", "CONV_2D", "DEPTHWISE_CONV_2D", "MEAN", "PAD", "SOFTMAX"]),
        _timed("int4_weights", 7.4, ["CONV_2D", "DEQUANTIZE"]),
        _timed("int8_weights", 1.3),
    ]
    on = f"p50 xnnpack/1t on {HOST}"
    assert summary.slower_than_float(rows, HOST) == [
        f"dynamic is 2.70x slower than float32 ({on}): DEPTHWISE_CONV_2D run on LiteRT's "
        "builtin kernels, not XNNPACK; use dynamic_auto (0.61x) for speed",
        f"int16x8 is 42.00x slower than float32 ({on}): ADD, CONV_2D, DEPTHWISE_CONV_2D, "
        "MEAN ... run on LiteRT's builtin kernels, not XNNPACK; use int8 (0.50x) for speed",
        f"int4_weights is 7.40x slower than float32 ({on}): CONV_2D, DEQUANTIZE run on "
        "LiteRT's builtin kernels, not XNNPACK; use int8_weights (1.30x) for speed",
        f"int8_weights is 1.30x slower than float32 ({on}): its kernels are slower on this "
        "CPU; use float32 for speed",
    ]
    assert summary.slower_than_float(rows[1:], HOST) == []  # no float32 to compare with
    # MobileNetV2 0.35 in B9: the usual alternative was slower still; float32 is named instead.
    rows = [_timed("float32", 1.0), _timed("dynamic", 1.24), _timed("dynamic_auto", 1.42)]
    assert [line.rsplit("; ", 1)[1] for line in summary.slower_than_float(rows, HOST)] == [
        "use float32 for speed",
        "use float32 for speed",
    ]


def test_a_ratio_inside_the_rounds_spread_is_no_measurable_difference():
    # int8_auto timed 1.75x int8 in one table: its rounds overlapped float32's
    rows = [_timed("float32", 1.0, spread=0.5), _timed("int8_auto", 1.3, spread=0.3)]
    assert summary.slower_than_float(rows, HOST) == [
        f"int8_auto vs float32: no measurable difference (p50 xnnpack/1t on {HOST}: 1.30x, "
        "inside the spread of the timing rounds)"
    ]
    rows = [_timed("float32", 1.0, spread=0.1), _timed("int8_auto", 1.3, spread=0.1)]
    # every round slower than every round of float32: measurable
    assert summary.slower_than_float(rows, HOST)[0].startswith("int8_auto is 1.30x slower")


def test_without_an_integer_dot_product_int8_advice_points_at_the_target():
    rows = [_timed("float32", 1.0), _timed("int8", 2.45), _timed("float16", 1.3)]
    host = "AMD EPYC, x86-64 AVX2, no VNNI"
    int8, float16 = summary.slower_than_float(rows, host, int8_dot=False)
    assert int8 == (
        f"int8 is 2.45x slower than float32 (p50 xnnpack/1t on {host}): its kernels are slower "
        "on this CPU; this CPU lacks integer dot-product instructions: on a phone with them (ARM "
        "dotprod) int8 speed may differ; time it there (--device adb)"
    )
    assert float16.endswith("use float32 for speed")  # no integer kernels involved


def test_fastest_runtime_names_the_winner_per_thread_count():
    row = {
        "latency": {
            "xnnpack/1t": {"p50_ms": 0.774},
            "latest/1t": {"p50_ms": 0.781},
            "compiled/1t": {"p50_ms": 0.769},
            "builtin/1t": {"p50_ms": 0.5},  # another kernel set, not a runtime setting
            "xnnpack/2t": {"p50_ms": 0.5},
        }
    }
    assert summary.fastest_runtime(row) == (
        "fastest runtime: 1t compiled 0.769 ms (xnnpack 0.774, latest 0.781)"
    )
    assert summary.fastest_runtime({"latency": {"xnnpack/1t": {"p50_ms": 1.0}}}) == ""
    settings = BenchSettings(threads=(1, 2), runtimes=("interpreter", "compiled"), kernels="both")
    assert [k for k, *_ in settings.settings()] == [
        "xnnpack/1t",
        "xnnpack/2t",
        "builtin/1t",
        "builtin/2t",
        "compiled/1t",
        "compiled/2t",
    ]
    with pytest.raises(ConfigError, match="unknown runtime 'ynnpack'; choose one of interpreter"):
        BenchSettings(runtimes=("ynnpack",))


def test_every_runtime_setting_times_the_model_quietly(model, tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(tflite.convert(model, "float32").content)
    for runtime in ("interpreter", "latest", "compiled"):
        result = benchmark.latency(path.read_bytes(), threads=1, runs=3, warmup=1, runtime=runtime)
        assert result["runtime"] == runtime and result["p50_ms"] > 0
    assert result["kernels"]["fully_accelerated"] is True  # every op on the CompiledModel's CPU
    done = subprocess.run(
        [sys.executable, "-m", "tfopt.export", "--benchmark", str(path), "--threads", "1"]
        + ["--runs", "3", "--warmup", "1", "--runtime", "interpreter,latest,compiled"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr  # no LiteRT start-up notice, no deprecation line
    assert "fastest runtime: 1t " in done.stdout and "p50 compiled/1t ms" in done.stdout


def test_a_runtime_the_installed_litert_lacks_is_one_line(model, monkeypatch):
    content = tflite.convert(model, "float32").content
    monkeypatch.setitem(sys.modules, "ai_edge_litert.compiled_model", None)  # import fails
    with pytest.raises(ConfigError) as e:
        benchmark.latency(content, threads=1, runs=1, warmup=0, runtime="compiled")
    assert "--runtime compiled needs ai-edge-litert's CompiledModel, which ai-edge-litert" in str(
        e.value
    )
    assert "use --runtime interpreter" in str(e.value) and "\n" not in str(e.value)
