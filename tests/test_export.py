"""TFLite export on a real MNIST model: every mode converts and evaluates, int8 I/O quantization,
the fidelity gate with selective quantization, the benchmark, and one-line errors for bad input."""

import json
import os
import subprocess
import sys
import zipfile

from tfopt.core._keras import keras, tf

import numpy as np
import pytest
from bench_checks import check_roofline
from export_fixtures import keras_macs, sensitive_run

from tfopt.core import peaks
from tfopt.core.errors import ConfigError, DataError, ModelError
from tfopt.core.fileio import write_json
from tfopt.export import benchmark, fidelity, metadata, parse_modes, summary, tflite
from tfopt.export.choices import DEFAULT_MODES
from tfopt.export.evaluate import TFLiteModel, evaluate, keras_outputs, load_split
from tfopt.export.runner import BenchSettings, ExportSettings
from tfopt.export.runner import run as export_run
from tfopt.models.io import save_model
from tfopt.runs import load_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST_BENCH = BenchSettings(threads=(1, 2), runs=10, warmup=2)


@pytest.fixture(scope="module")
def run(mnist_run):
    return load_run(mnist_run)


@pytest.fixture(scope="module")
def model(run):
    from tfopt.models.io import load_model

    return load_model(run.model_path)


@pytest.fixture(scope="module")
def calibration(run):
    return tflite.calibration_batches(run.config.data, 4)


@pytest.fixture(scope="module")
def test_set(run, model):
    x, y = load_split(run.config.data, "test", 1000)
    return x, y, keras_outputs(model, x)


@pytest.fixture(scope="module")
def exported(mnist_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "out"
    settings = ExportSettings(calibration_steps=4, eval_limit=500, bench=FAST_BENCH)
    return export_run(mnist_run, settings, out_dir=str(out)).section, out


@pytest.mark.slow
def test_every_mode_converts_evaluates_and_is_recorded(exported, mnist_run, model):
    record, out = exported
    rows = {r["mode"]: r for r in record["modes"]}
    macs = sum(keras_macs(model).values())
    assert list(rows) == list(DEFAULT_MODES)
    for mode, row in rows.items():
        ev = row["eval"]
        assert ev["examples"] == 500
        assert ev["accuracy"] > 0.9, (mode, ev)  # chance is 0.1
        assert ev["agreement"] >= 0.97, (mode, ev)
        assert abs(ev["accuracy_delta_pt"] - 100 * (ev["accuracy"] - ev["keras_accuracy"])) < 1e-6
        assert row["gate"]["passed"], (mode, row["gate"])
        assert os.path.getsize(out / row["file"]) == row["size_bytes"] + row["metadata_bytes"]
        assert 0 < row["metadata_bytes"] < 4096 < row["size_bytes"]  # softmax, names, metadata
        assert 0 < row["gzip_bytes"] <= row["size_bytes"] * 1.01
        for key in ("xnnpack/1t", "xnnpack/2t"):
            assert 0 < row["latency"][key]["p50_ms"] <= row["latency"][key]["p95_ms"]
            # The roofline: the Keras layers' multiply-adds, and a bound no measured time beats.
            roof = row["roofline"][key]
            assert roof["macs"] == macs, (mode, key, roof)
            check_roofline(roof, peaks())  # no bound where this CPU's int8 peak is unknown (AMX)
        roof = row["roofline"]["xnnpack/1t"]
        assert sum(c["ms"] for c in roof["classes"].values()) == pytest.approx(roof["p50_ms"])
        assert roof["summary"].startswith("time: conv/FC "), roof["summary"]
    assert rows["float32"]["eval"]["max_abs_error"] < 1e-3  # same float math as Keras
    # Who quantized each file: the converter by default, LiteRT Quantizer for dynamic_auto.
    assert {m: r["quantizer"] for m, r in rows.items()} == {
        m: None if m == "float32" else "litert" if m == "dynamic_auto" else "converter"
        for m in rows
    }
    assert b"quantized by LiteRT Quantizer" in (out / rows["dynamic_auto"]["file"]).read_bytes()
    # Every file carries its input contract, gives probabilities under the signature's names.
    int8 = out / rows["int8"]["file"]
    packed = metadata.read(str(int8))
    assert (
        "labels.txt" not in packed and not (out / "labels.txt").exists()
    )  # MNIST's classes have no names
    assert json.loads(packed["input.json"]) == json.loads((out / "input.json").read_text())
    assert b"quantized by the TFLite converter" in int8.read_bytes()
    assert zipfile.ZipFile(int8).testzip() is None  # the standard library reads it as a zip
    x = load_split(load_run(mnist_run).config.data, "test", 8)[0]
    from ai_edge_litert.interpreter import Interpreter

    sig = Interpreter(str(int8)).get_signature_list()["serving_default"]
    assert (sig["inputs"], sig["outputs"]) == (["image"], ["probabilities"])
    probs = TFLiteModel(str(int8)).predict(x)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-2)
    np.testing.assert_array_equal(np.argmax(probs, 1), np.argmax(model.predict(x, verbose=0), 1))
    assert rows["float32"]["kernels"]["delegated_ops"] == rows["float32"]["kernels"]["total_ops"]
    # int8 weights are 4x smaller than float32, float16 2x (plus a little graph overhead)
    f32 = rows["float32"]["size_bytes"]
    assert rows["int8"]["size_bytes"] < f32 / 3.5 and rows["dynamic_auto"]["size_bytes"] < f32 / 3.5
    assert f32 / 2.2 < rows["float16"]["size_bytes"] < f32 / 1.8
    on_disk = json.loads((out / "run.json").read_text())
    assert on_disk["stage"] == "export" and on_disk["schema_version"] == 2
    assert on_disk["export"]["modes"] == record["modes"] and on_disk["model"]["params"] == 220522
    assert on_disk["artifacts"]["int8"] == "model_int8.tflite"
    table, roofline_md = (out / "export.md").read_text().split("## Roofline")
    assert table.count("\n| ") == len(rows) + 1
    assert (
        roofline_md.count("| whole model ") == len(rows) and "one core's peaks at " in roofline_md
    )
    assert record["cpu_peaks"]["fp32"]["gmacs"] > 0
    # Whatever the timings were, every mode slower than float32 is named in the notes.
    host = record["host"]
    said = summary.slower_than_float(record["modes"], host["cpu"], host["int8_dot"])
    assert set(said) <= set(record["notes"])
    assert host["isa"] in host["cpu"] and host["cpu"] in (out / "export.md").read_text()
    assert (out / "export.png").read_bytes()[:4] == b"\x89PNG"
    assert not [p for p in os.listdir(out) if p.startswith(".tmp")]
    assert "export" not in os.listdir(mnist_run)  # -o given: the input run is untouched
    keras_fig = record[
        "keras"
    ]  # the float Keras model itself: the baseline every .tflite is compared with
    assert keras_fig["params"] == 220522 and keras_fig["flops"] == on_disk["model"]["flops"]
    assert (
        keras_fig["weights_bytes"] == 4 * 220522
    )  # float32; count_params() includes BN moving statistics
    assert keras_fig["file_bytes"] == os.path.getsize(os.path.join(mnist_run, "model.keras"))
    assert list(keras_fig["latency"]) == ["1t", "2t"]
    for key, threads in (("1t", 1), ("2t", 2)):
        lat = keras_fig["latency"][key]
        assert (
            lat["threads"] == threads
            and lat["inter_op_threads"] == 1
            and lat["runs"] == FAST_BENCH.runs
        )
        assert 0 < lat["p50_ms"] <= lat["p95_ms"]
    assert record["settings"]["bench"]["keras"] is True
    header = record["table"].splitlines()[0]
    for column in (
        "mode",
        "size",
        "gzip",
        "p50 xnnpack/1t",
        "p95 xnnpack/2t",
        "accuracy",
        "Δ vs Keras",
        "agreement",
    ):
        assert column in header


@pytest.mark.slow
def test_calibration_is_deterministic_and_from_the_training_pipeline(run, calibration):
    again = tflite.calibration_batches(run.config.data, 4)
    assert len(calibration) == 4 and calibration[0].shape == (
        run.config.data.global_batch_size,
        28,
        28,
        1,
    )
    assert all(np.array_equal(a, b) for a, b in zip(calibration, again))
    train_x, _ = load_split(run.config.data, "train")
    # Shuffled (not the first records of the split) and made of training images only.
    assert not np.array_equal(calibration[0], train_x[: len(calibration[0])])
    assert any(np.array_equal(calibration[0][0], img) for img in train_x)


@pytest.mark.slow
@pytest.mark.parametrize("io_type", ["int8", "uint8"])
def test_int8_io_quantization_is_applied_with_the_tensor_scale(
    model, calibration, test_set, exported, io_type
):
    x, y, ref = test_set
    quant = TFLiteModel(
        tflite.convert(
            model, "int8", calibration=calibration, options=tflite.ConvertOptions(io=io_type)
        ).content
    )
    # The exported int8 model: same run, same 4 calibration batches, float I/O.
    floatio = TFLiteModel(str(exported[1] / "model_int8.tflite"))
    assert floatio.input_dtype == np.float32
    assert quant.input_dtype == np.dtype(io_type) and quant.output_dtype == np.dtype(io_type)
    scale, zp = quant.quantization("input")
    assert scale == pytest.approx(1 / 255, rel=1e-3)  # calibrated on images in [0, 1]
    assert zp == (-128 if io_type == "int8" else 0)
    expected = np.clip(np.round(x[:4] / scale + zp), np.iinfo(io_type).min, np.iinfo(io_type).max)
    assert np.array_equal(quant.quantize_input(x[:4]), expected.astype(io_type))
    # Same int8 graph inside: quantized I/O must reproduce the float-I/O outputs within one output
    # step. The exported file ends in a float softmax, which moves no probability by more than half
    # the largest change of a logit.
    out_scale = quant.quantization("output")[0]
    logits = quant.predict(x[:200]).astype(np.float64)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    assert np.max(np.abs(probs - floatio.predict(x[:200]))) <= out_scale * 0.5 * 1.01
    good = evaluate(quant, x, y, ref)
    assert good.accuracy > 0.9 and good.agreement > 0.97
    # A deliberately wrong scale (10x, or none at all: floats cast straight to integer codes) collapses it.
    for wrong in (scale * 10, 1.0):
        bad = evaluate(quant, x, y, ref, input_scale=wrong)
        assert bad.accuracy < 0.5 and bad.agreement < 0.5, (wrong, bad)


def _sensitive_run(run, tmp_path):
    return sensitive_run(run.config, tmp_path)[0]


@pytest.mark.slow
def test_gate_catches_a_quantization_sensitive_model_and_selective_quantization_fixes_it(
    run, tmp_path
):
    src = _sensitive_run(run, tmp_path)
    settings = ExportSettings(
        modes=("int8",),
        calibration_steps=4,
        eval_limit=1000,
        search_limit=1000,
        bench=BenchSettings(threads=(1,), runs=5, warmup=1),
        plot=False,
    )
    record = export_run(src, settings, out_dir=str(tmp_path / "out")).section
    full, sel = record["modes"]
    assert full["mode"] == "int8" and not full["gate"]["passed"]
    assert full["eval"]["agreement"] < 0.5 and "agreement" in full["gate"]["reasons"][0]
    assert sel["mode"] == "int8-selective" and sel["gate"]["passed"]
    assert record["gate_failures"] == {}  # the selective model stands in for the plain int8
    assert sel["eval"]["agreement"] >= 0.99 and sel["eval"]["accuracy"] > 0.85
    ranking = sel["selective"]["ranking"]
    assert (
        "/fc0/" in ranking[0]["tensor_name"]
        and ranking[0]["rmse_over_scale"] > 10 * ranking[1]["rmse_over_scale"]
    )
    chosen = sel["selective"]["trials"][sel["selective"]["chosen"]]
    assert len(chosen["float_layers"]) == 1 and "/fc0/" in chosen["float_layers"][0]
    assert sel["size_bytes"] > full["size_bytes"]  # the trade-off: fc0's weights stay float32
    assert "fc0" in record["notes"][0] and "passed" in record["notes"][0]
    assert os.path.exists(tmp_path / "out" / "model_int8_selective.tflite")


@pytest.mark.slow
def test_float_layers_keep_named_layers_in_float(model, calibration, test_set):
    x, y, ref = test_set
    debugger = fidelity.quantization_debugger(model, calibration, calibration[:1])
    ranking = fidelity.rank_layers(debugger)
    assert {"conv0", "conv1", "fc"} <= set(fidelity.layer_names(ranking))
    nodes = fidelity.nodes_for_layers(ranking, ["conv0"])
    partial = TFLiteModel(fidelity.requantize(debugger, nodes))
    ops = [op["op_name"] for op in partial.interpreter._get_ops_details()]
    assert ops[:2] == ["CONV_2D", "QUANTIZE"]  # conv0 runs in float, then the rest is int8
    assert evaluate(partial, x, y, ref).agreement > 0.97
    with pytest.raises(ConfigError, match="'nope' is not a quantized layer.*conv0"):
        fidelity.nodes_for_layers(ranking, ["nope"])


@pytest.mark.slow
def test_pruned_model_uses_the_sparse_encoding_only_when_smaller_and_runnable(test_set):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((28, 28, 1))
    h = keras.layers.Dense(256, activation="relu")(keras.layers.Flatten()(inputs))
    pruned = keras.Model(inputs, keras.layers.Dense(10)(h))
    weights = []
    for w in pruned.get_weights():
        if w.ndim >= 2:  # magnitude pruning to 80% zeros, as tfmot's schedule ends
            w[np.abs(w) < np.quantile(np.abs(w), 0.8)] = 0
        weights.append(w)
    pruned.set_weights(weights)
    assert tflite.weight_sparsity(pruned) == pytest.approx(0.8, abs=0.01)
    x, _, _ = test_set
    # float16: the sparse file is much smaller and runs with the same outputs -> auto keeps it.
    dense = tflite.convert(pruned, "float16", options=tflite.ConvertOptions(sparsity="off"))
    auto = tflite.convert(pruned, "float16")
    assert (
        auto.sparse
        and len(auto.content) < 0.6 * len(dense.content)
        and "sparse encoding" in auto.notes[0]
    )
    assert np.allclose(
        TFLiteModel(auto.content).predict(x[:200]),
        TFLiteModel(dense.content).predict(x[:200]),
        atol=1e-4,
    )
    # dynamic range: smaller too, but LiteRT's XNNPACK delegate refuses sparse quantized kernels -> kept dense.
    dyn = tflite.convert(pruned, "dynamic")
    assert not dyn.sparse and "XNNPACK delegate refuses its sparse FULLY_CONNECTED" in dyn.notes[0]
    with pytest.raises(tflite.ConversionError, match="sparse-encoded 'dynamic' model does not run"):
        tflite.convert(pruned, "dynamic", options=tflite.ConvertOptions(sparsity="on"))


@pytest.mark.slow
def test_unconvertible_op_is_named_with_its_layer():
    inputs = keras.Input((4, 4), name="m")
    det = tf.linalg.det(inputs)  # MatrixDeterminant has no builtin TFLite kernel
    m = keras.Model(inputs, keras.layers.Dense(2, name="head")(keras.layers.Reshape((1,))(det)))
    with pytest.raises(tflite.ConversionError) as err:
        tflite.convert(m, "float32")
    msg = str(err.value)
    assert "MatrixDeterminant (layer 'tf.linalg.det')" in msg and "--allow-select-tf-ops" in msg
    assert "\n" not in msg
    flex = tflite.convert(m, "float32", options=tflite.ConvertOptions(allow_select_tf_ops=True))
    with pytest.raises(ModelError, match="FlexMatrixDeterminant.*no Flex delegate"):
        TFLiteModel(flex.content)


@pytest.mark.slow
def test_mixed_precision_model_converts_as_float32():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        inputs = keras.Input((28, 28, 1))
        h = keras.layers.Flatten()(keras.layers.Conv2D(4, 3)(inputs))
        m = keras.Model(inputs, keras.layers.Dense(10, dtype="float32")(h))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    x = np.random.default_rng(0).random((8, 28, 28, 1), dtype=np.float32)
    out = TFLiteModel(tflite.convert(m, "float32").content).predict(x)
    assert np.max(np.abs(out - m(x).numpy())) < 0.05  # bf16 Keras vs the float32 twin


@pytest.mark.slow
def test_bad_inputs_give_one_line_errors(exported, tmp_path):
    record, out = exported
    m = TFLiteModel(str(out / "model_int8.tflite"))
    x = np.random.default_rng(0).random((3, 28, 28, 1), dtype=np.float32)
    x[1, 5, 5, 0] = np.nan
    cases = [
        (x, "1 NaN/Inf value.*index \\(1, 5, 5, 0\\)"),
        (np.full((2, 28, 28, 1), np.inf, np.float32), "NaN/Inf"),
        (
            np.zeros((2, 28, 28), np.float32),
            "shape \\(2, 28, 28\\) does not match.*\\(N, 28, 28, 1\\)",
        ),
        (np.zeros((2, 32, 32, 1), np.float32), "shape \\(2, 32, 32, 1\\)"),
        (np.array([["a"] * 28] * 2), "dtype <U1 is not numeric"),
        (np.zeros((0, 28, 28, 1), np.float32), "empty"),
    ]
    for bad, pattern in cases:
        with pytest.raises(DataError, match=pattern) as err:
            m.predict(bad)
        assert "\n" not in str(err.value)
    with pytest.raises(ModelError, match="does not exist"):
        TFLiteModel(str(tmp_path / "missing.tflite"))
    (tmp_path / "fake.tflite").write_bytes(b"not a flatbuffer at all")
    with pytest.raises(ModelError, match="not a TFLite model"):
        TFLiteModel(str(tmp_path / "fake.tflite"))
    with pytest.raises(ConfigError, match="unknown mode 'int4'; choose one of float32, dynamic"):
        parse_modes("float32,int4")
    with pytest.raises(ConfigError, match="unknown io 'int16'"):
        tflite.ConvertOptions(io="int16")
    with pytest.raises(ConfigError, match="min agreement"):
        fidelity.Thresholds(min_agreement=1.5)


@pytest.mark.slow
def test_benchmark_latency_kernels_sizes_and_keras_cost(exported, model):
    _, out = exported
    path = str(out / "model_float32.tflite")
    fast = benchmark.latency(path, threads=1, runs=20, warmup=2)
    assert 0 < fast["min_ms"] <= fast["p50_ms"] <= fast["p95_ms"] and fast["runs"] == 20
    assert (
        fast["kernels"]["delegate_partitions"] == 1 and fast["kernels"]["builtin_kernel_ops"] == []
    )
    plain = benchmark.latency(path, threads=2, runs=5, warmup=1, xnnpack=False)
    assert (
        plain["kernels"]["delegate_partitions"] == 0
        and "CONV_2D" in plain["kernels"]["builtin_kernel_ops"]
    )
    content = open(path, "rb").read()
    sizes = benchmark.file_sizes(content)
    assert sizes["size_bytes"] == len(content) and sizes["gzip_bytes"] < len(content)
    cost = benchmark.keras_cost(model)
    # 2 x multiply-adds of conv0, conv1, fc and logits; the profiler adds BN/ReLU/bias ops on top.
    macs = 28 * 28 * 32 * 9 + 14 * 14 * 64 * 32 * 9 + 3136 * 64 + 64 * 10
    assert cost["params"] == 220522 and 2 * macs <= cost["flops"] <= 2 * macs * 1.02


def _cli(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop(
        "TF_CPP_MIN_LOG_LEVEL", None
    )  # as a user runs it: native start-up notices must not leak
    return subprocess.run(
        [sys.executable, "-m", "tfopt.export", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            ["--from", "/nonexistent/run"],
            "'/nonexistent/run' does not exist; give the -o directory of a training run or a model file",
        ),
        (["--from", ".", "--modes", "float32,int4"], "unknown mode 'int4'; choose one of"),
        (["--from", ".", "--io", "int16"], "--io: invalid choice: 'int16' (choose from 'float'"),
        (
            ["--from", ".", "--modes", "float16", "--float-layers", "conv0"],
            "--float-layers is not used by --modes float16 (it belongs to int8); add int8 to --modes",
        ),
        (["--benchmark", "missing.tflite"], "--benchmark 'missing.tflite': no such file"),
        (
            ["--evaluate", "missing.tflite", "--dataset", "mnist"],
            "--evaluate 'missing.tflite': no such file",
        ),
        (
            ["--benchmark", "x.tflite", "--threads", "1,zero"],
            "thread count 'zero' is not an integer",
        ),
        (["--from", ".", "--calibration-steps", "0"], "export.calibration_steps=0 must be >= 1"),
        (["--from", ".", "--auto-candidates", "1"], "export.auto_candidates=1 must be >= 2"),
        (
            ["--from", ".", "--modes", "int8_automatic"],
            "unknown mode 'int8_automatic'; choose one of float32, dynamic, "
            "float16, int8, int8_auto, int16x8",
        ),
        ([], "one of the arguments --from --evaluate --benchmark is required"),
    ],
)
@pytest.mark.slow
def test_cli_user_errors_exit_2_with_one_line(args, needle, tmp_path):
    if "x.tflite" in args:
        (tmp_path / "x.tflite").write_bytes(b"")
        args = [str(tmp_path / a) if a == "x.tflite" else a for a in args]
    proc = _cli(*args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


@pytest.mark.slow
def test_cli_export_int8_io_then_evaluate_and_benchmark(mnist_run, tmp_path):
    out = tmp_path / "exp"
    proc = _cli(
        "--from",
        mnist_run,
        "--modes",
        "int8",
        "--io",
        "int8",
        "--calibration-steps",
        "2",
        "--eval-limit",
        "300",
        "--runs",
        "5",
        "--warmup",
        "1",
        "--threads",
        "1",
        "--no-plot",
        "--no-keras-latency",
        "-o",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| int8 " in proc.stdout and "run.json" in proc.stdout
    record = json.loads((out / "run.json").read_text())["export"]
    assert record["modes"][0]["io"] == "int8" and record["settings"]["calibration_steps"] == 2
    assert (
        record["keras"]["latency"] == {} and record["keras"]["weights_bytes"] > 0
    )  # --no-keras-latency
    tfl = str(out / "model_int8.tflite")
    bench = _cli(
        "--benchmark",
        tfl,
        "--threads",
        "1,2",
        "--runs",
        "5",
        "--warmup",
        "1",
        "--kernels",
        "both",
        "-o",
        str(tmp_path / "b"),
    )
    assert bench.returncode == 0, bench.stderr[-3000:]
    assert (
        "xnnpack/2t" in bench.stdout
        and "builtin/1t" in bench.stdout
        and "XNNPACK partition" in bench.stdout
    )
    assert set(json.loads((tmp_path / "b" / "benchmark.json").read_text())["latency"]) == {
        "xnnpack/1t",
        "xnnpack/2t",
        "builtin/1t",
        "builtin/2t",
    }
    # The CNN takes 28x28x1 images: 8x8 digits are refused with one line, not silently scored.
    wrong = _cli("--evaluate", tfl, "--dataset", "digits", "--eval-limit", "50")
    assert (
        wrong.returncode == 2 and "does not match the model's input (N, 28, 28, 1)" in wrong.stderr
    )
    assert len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr


@pytest.mark.slow
def test_cli_evaluate_on_mnist(exported, tmp_path):
    _, out = exported
    proc = _cli(
        "--evaluate",
        str(out / "model_float16.tflite"),
        "--dataset",
        "mnist",
        "--eval-limit",
        "500",
        "-o",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads((tmp_path / "evaluate.json").read_text())
    assert (
        row["eval"]["examples"] == 500
        and row["eval"]["accuracy"] > 0.9
        and row["dataset"] == "mnist"
    )


@pytest.mark.slow
def test_qat_model_converts_to_int8_only(run, test_set):
    import tensorflow_model_optimization as tfmot

    x, y, _ = test_set
    train_x, train_y = load_split(run.config.data, "train", 2048)
    inputs = keras.Input((28, 28, 1), name="image")
    h = keras.layers.Dense(64, activation="relu", name="fc0")(
        keras.layers.Flatten(name="flatten")(inputs)
    )
    qat = tfmot.quantization.keras.quantize_model(
        keras.Model(inputs, keras.layers.Dense(10, name="logits")(h))
    )
    qat.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), ["accuracy"])
    qat.fit(train_x, train_y, epochs=1, batch_size=64, verbose=0)
    assert tflite.is_qat_model(qat)
    with pytest.raises(ConfigError, match="QAT.*int8 only, not float32"):
        tflite.check_modes_for(qat, ["float32", "int8"])
    with pytest.raises(
        ConfigError, match="int8 only, not int8_auto"
    ):  # it carries its own ranges: no search
        tflite.check_modes_for(qat, ["int8_auto"])
    conv = tflite.convert(
        qat, "int8", options=tflite.ConvertOptions(io="int8")
    )  # no calibration needed
    m = TFLiteModel(conv.content)
    assert conv.qat and m.input_dtype == np.int8
    result = evaluate(m, x, y, keras_outputs(qat, x))
    assert result.agreement >= 0.98 and result.accuracy > 0.6  # 1 epoch on 2k images; chance is 0.1


# ---------------------------------------------------------------------------------------------
# Converter errors vs. bugs, native stderr around the noisy calls, one QAT test, one strip.


class _FakeConverter:
    def __init__(self, error: BaseException):
        self.error = error

    def convert(self):
        raise self.error


def _tiny_model():
    inputs = keras.Input((8, 8, 1), name="image")
    h = keras.layers.Dense(8, activation="relu", name="fc0")(
        keras.layers.Flatten(name="flatten")(inputs)
    )
    return keras.Model(inputs, keras.layers.Dense(10, name="logits")(h))


@pytest.mark.slow
def test_converter_errors_become_one_line_and_bugs_keep_their_traceback():
    from tensorflow.lite.python.convert_phase import ConverterError

    model = _tiny_model()
    refused = ConverterError(
        "<unknown>:0: error: loc(\"m/det\"): 'tf.MatrixDeterminant' op is neither a custom "
        "op nor a flex op\n<unknown>:0: note: see current operation: ...\nerror: failed"
    )
    with pytest.raises(tflite.ConversionError) as err:
        tflite.run_converter(_FakeConverter(refused), model, "float32", tflite.ConvertOptions())
    assert "MatrixDeterminant" in str(err.value) and "\n" not in str(err.value)
    calibration = RuntimeError("Attempting to resize dimension 1 of tensor 0 with value 4 to 5.")
    with pytest.raises(
        tflite.ConversionError, match="cannot convert to 'int8': Attempting to resize"
    ):
        tflite.run_converter(_FakeConverter(calibration), model, "int8", tflite.ConvertOptions())
    # A bug (ours or the converter's), memory exhaustion, a missing feature: the original exception.
    for bug in (
        ZeroDivisionError("division by zero"),
        MemoryError(),
        NotImplementedError("todo"),
        TypeError("unsupported operand"),
    ):
        with pytest.raises(type(bug)) as err:
            tflite.run_converter(_FakeConverter(bug), model, "float32", tflite.ConvertOptions())
        assert err.value is bug


class QuantizeWrapper(keras.layers.Layer):
    """A user layer that merely shares the name of tfmot's QAT wrapper."""

    def call(self, x):
        return x


def test_qat_detection_uses_tfmots_classes_not_names():
    import tensorflow_model_optimization as tfmot

    from tfopt.compress.quantize import is_qat_model

    inputs = keras.Input((8, 8, 1))
    lookalike = keras.Model(
        inputs, keras.layers.Dense(2)(QuantizeWrapper()(keras.layers.Flatten()(inputs)))
    )
    assert not tflite.is_qat_model(lookalike) and not is_qat_model(lookalike)
    qat = tfmot.quantization.keras.quantize_model(_tiny_model())
    assert tflite.is_qat_model(qat) and is_qat_model(qat)
    from tfopt import export

    assert export.is_qat_model is tflite.is_qat_model  # still importable from tfopt.export


def test_export_strips_pruning_and_clustering_wrappers_but_keeps_qat(monkeypatch):
    import tensorflow_model_optimization as tfmot

    from tfopt.compress.common import all_layers, strip_wrappers
    from tfopt.core._compat import CLUSTER_WRAPPERS, PRUNE_WRAPPERS
    from tfopt.export import runner

    pruned = tfmot.sparsity.keras.prune_low_magnitude(_tiny_model())
    clustered = tfmot.clustering.keras.cluster_weights(
        _tiny_model(),
        number_of_clusters=4,
        cluster_centroids_init=tfmot.clustering.keras.CentroidInitialization.LINEAR,
    )
    qat = tfmot.quantization.keras.quantize_model(_tiny_model())
    for wrapped in (pruned, clustered):
        monkeypatch.setattr(runner, "load_model", lambda path, trust_model=False, m=wrapped: m)
        plain = runner.load_source_model("run")
        assert not any(
            isinstance(layer, PRUNE_WRAPPERS + CLUSTER_WRAPPERS) for layer in all_layers(plain)
        )
        assert [layer.name for layer in plain.layers][-1] == "logits"
    clustered_plain = strip_wrappers(clustered)
    assert len(np.unique(clustered_plain.get_layer("fc0").get_weights()[0])) <= 4
    assert strip_wrappers(qat) is qat and tflite.is_qat_model(strip_wrappers(qat))
    plain = _tiny_model()
    assert strip_wrappers(plain) is plain


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A run directory with an untrained 8x8 MLP on scikit-learn's digits: a CLI export takes seconds."""
    from tfopt import config as config_lib

    out = tmp_path_factory.mktemp("tiny_run")
    cfg = config_lib.from_dict(
        {"data": {"dataset": "digits", "data_dir": str(out / "data"), "global_batch_size": 32}}
    )
    save_model(_tiny_model(), str(out / "run"))
    write_json(str(out / "run" / "run.json"), {"stage": "train", "config": cfg.to_dict()})
    return str(out / "run")


# Runs the export CLI with one piece replaced, the way a native library or a bug would behave.
_WRAPPER = r"""
import os, sys
from tfopt.export import cli, converter, evaluate

how = sys.argv[1]
NOISE = b"fully_quantize: 0, inference_type: 6, input_inference_type: FLOAT32\n"
if how == "interpreter-warns":
    Interpreter, resolver = evaluate._interpreter_class()

    class Warning(Interpreter):
        def __init__(self, *args, **kwargs):
            os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n")
            os.write(2, b"W0000 tfopt-test: a native warning at interpreter creation\n")
            super().__init__(*args, **kwargs)

    evaluate._interpreter_class = lambda: (Warning, resolver)
else:
    class Crashing:
        def convert(self):
            os.write(2, NOISE)
            os.write(2, b"F0000 tfopt-test: native check failed in the converter\n")
            if how == "abort":
                os.abort()
            return 1 / 0  # a bug: must keep its traceback

    converter.make_converter = lambda *args, **kwargs: Crashing()
sys.exit(cli.main(sys.argv[2:]))
"""


def _wrapped_cli(tmp_path, how, *args):
    script = tmp_path / "wrapped_export.py"
    script.write_text(_WRAPPER)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as a user runs it
    return subprocess.run(
        [sys.executable, str(script), how, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _export_args(run_dir, tmp_path, modes="float32"):
    # The tiny model is untrained: an open gate keeps the exit code about what is tested here.
    int8 = ["--calibration-steps", "2", "--no-selective"] if "int8" in modes else []
    return [
        "--from",
        run_dir,
        "--modes",
        modes,
        *int8,
        "--runs",
        "2",
        "--warmup",
        "0",
        "--threads",
        "1",
        "--min-agreement",
        "0",
        "--max-accuracy-drop",
        "100",
        "--no-plot",
        "-o",
        str(tmp_path / "out"),
    ]


@pytest.mark.slow
def test_cli_filters_native_notices_and_forwards_other_native_lines_at_once(tiny_run, tmp_path):
    proc = _wrapped_cli(
        tmp_path, "interpreter-warns", *_export_args(tiny_run, tmp_path, "float32,int8")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    warning = "W0000 tfopt-test: a native warning at interpreter creation"
    # The real notices (CUDA probe, XNNPACK delegate, quantizer settings) and the fake one are gone;
    # only progress lines and the native warning are left.
    assert [ln for ln in lines if not ln.startswith("tfopt export: ") and ln != warning] == [], (
        proc.stderr
    )
    # The warning shows when it is printed (before the next progress line), not when the export ends.
    first = lines.index(warning)
    assert lines[first - 1] == "tfopt export: [1/2] float32: evaluating on 299 test examples", (
        proc.stderr
    )
    assert lines[first + 1] == "tfopt export: [1/2] float32: benchmarking", proc.stderr


@pytest.mark.slow
def test_cli_native_abort_in_the_converter_keeps_its_message(tiny_run, tmp_path):
    import signal

    proc = _wrapped_cli(tmp_path, "abort", *_export_args(tiny_run, tmp_path))
    assert proc.returncode == -signal.SIGABRT, proc.stderr[-3000:]
    assert "F0000 tfopt-test: native check failed in the converter" in proc.stderr, proc.stderr
    assert "fully_quantize" not in proc.stderr


@pytest.mark.slow
def test_cli_bug_in_the_conversion_keeps_its_traceback(tiny_run, tmp_path):
    proc = _wrapped_cli(tmp_path, "bug", *_export_args(tiny_run, tmp_path))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert (
        "Traceback (most recent call last)" in proc.stderr and "ZeroDivisionError" in proc.stderr
    ), proc.stderr
    assert "error: cannot convert" not in proc.stderr
    # The converter's own output is hidden when Python gets control back (its exception says it all).
    assert "F0000 tfopt-test" not in proc.stderr and "fully_quantize" not in proc.stderr


@pytest.mark.slow
def test_exporting_a_float_model_does_not_import_tfmot(tiny_run):
    code = (
        "import sys\nfrom tfopt.export import runner, tflite\n"
        f"m = runner.load_source_model({tiny_run!r})\n"
        "assert not tflite.is_qat_model(m)\n"
        "assert 'tensorflow_model_optimization' not in sys.modules, 'tfmot imported'\n"
    )
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_gate_failures_name_each_failed_mode_unless_a_selective_int8_passed():
    from tfopt.export.runner import gate_failures

    def row(mode, passed, why="agreement 0.4 < 0.98"):
        return {"mode": mode, "gate": {"passed": passed, "reasons": [] if passed else [why]}}

    rows = [
        {"mode": "float32", "gate": None},
        row("int8", False),
        row("int16x8", False, "accuracy drop 2 pt"),
    ]
    assert gate_failures(rows) == {"int8": "agreement 0.4 < 0.98", "int16x8": "accuracy drop 2 pt"}
    assert gate_failures(rows + [row("int8-selective", True)]) == {"int16x8": "accuracy drop 2 pt"}
    assert gate_failures(rows + [row("int8-selective", False)])["int8"] == "agreement 0.4 < 0.98"
    assert gate_failures([row("dynamic", True)]) == {}
