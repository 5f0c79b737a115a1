"""Timing on the phone (--device adb) against a stand-in adb that answers as adb does and
replays benchmark_model's output (tests/fake_adb/adb; no phone here)."""

import json
import os

import pytest

from tfopt.core.errors import ConfigError
from tfopt.export import device

HERE = os.path.dirname(__file__)
REPLAY = os.path.join(HERE, "data", "benchmark_model_arm64.txt")


@pytest.fixture
def phone(tmp_path, monkeypatch):
    """The stand-in adb first on PATH, its phone's /data/local/tmp in tmp_path/phone."""
    root = tmp_path / "phone"
    root.mkdir()
    monkeypatch.setenv("PATH", os.path.join(HERE, "fake_adb") + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("FAKE_ADB_ROOT", str(root))
    monkeypatch.setenv("FAKE_ADB_REPLAY", REPLAY)
    binary = tmp_path / "benchmark_model"
    binary.write_bytes(b"\x7fELF benchmark_model for arm64")
    return root, str(binary)


def _calls(root) -> list[list[str]]:
    return [json.loads(line) for line in (root / "calls.jsonl").read_text().splitlines()]


def test_benchmark_model_output_is_read_as_it_prints_it():
    with open(REPLAY) as f:
        figures = device.parse_output(f.read())
    # the second statistics line is the timed runs' (the first is the warmup's), in microseconds
    assert figures["p50_ms"] == 1.854 and figures["p95_ms"] == 1.93 and figures["min_ms"] == 1.832
    assert figures["mean_ms"] == 1.86835 and figures["timed_runs"] == 200
    # the timed runs' profile, not the initialization's
    assert figures["ops_ms"] == {
        "Convolution (NHWC, QC8) IGEMM": 1.398,
        "Fully Connected (NC, QS8)": 0.298,
        "SOFTMAX": 0.091,
        "Max Pooling (NHWC, S8)": 0.058,
    }


def test_an_older_build_without_percentiles_gives_its_mean_and_no_median():
    with open(os.path.join(HERE, "data", "benchmark_model_old.txt")) as f:
        figures = device.parse_output(f.read())
    assert (
        figures["p50_ms"] is None and figures["mean_ms"] == 3.32094 and figures["min_ms"] == 3.264
    )
    assert figures["timed_runs"] == 50 and figures["ops_ms"] == {}
    assert device.parse_output("ERROR: Benchmarking failed.\n") is None


def test_a_model_is_pushed_timed_with_xnnpack_and_removed(phone, tmp_path):
    root, binary = phone
    model = tmp_path / "model_int8.tflite"
    model.write_bytes(b"TFL3 a model")
    dev = device.Device.connect("adb", binary)
    figures = dev.time(str(model), threads=2, runs=50, warmup=5)
    assert dev.label == "Pixel 9, arm64-v8a" and figures["device"] == "Pixel 9, arm64-v8a"
    assert figures["p50_ms"] == 1.854 and figures["threads"] == 2 and figures["runs"] == 50
    calls = _calls(root)
    remote = f"{device.REMOTE_DIR}/model_int8.tflite"
    assert ["push", binary, f"{device.REMOTE_DIR}/benchmark_model"] in calls
    assert ["shell", "chmod", "755", f"{device.REMOTE_DIR}/benchmark_model"] in calls
    run = next(c[1] for c in calls if c[0] == "shell" and c[1].startswith(device.REMOTE_DIR))
    assert run.split()[1:6] == [
        f"--graph={remote}",
        "--num_threads=2",
        "--use_xnnpack=true",
        "--num_runs=50",
        "--warmup_runs=5",
    ]
    assert calls[-1] == ["shell", "rm", "-f", remote]
    assert not (root / "tfopt" / "model_int8.tflite").exists()


@pytest.mark.parametrize(
    "state, spec, needle",
    [
        ("none", "adb", "no Android device is connected"),
        ("unauthorized", "adb", "accept the 'Allow USB debugging' dialog"),
        ("full", "adb", "has no space left in /data/local/tmp/tfopt"),
        ("two", "adb", "name one with --device adb:SERIAL"),
        ("device", "adb:NOPE", "no Android device with serial 'NOPE'"),
    ],
)
def test_a_device_that_cannot_be_used_is_one_line_with_the_fix(
    phone, monkeypatch, state, spec, needle
):
    monkeypatch.setenv("FAKE_ADB_STATE", state)
    with pytest.raises(device.DeviceError, match=needle) as e:
        device.Device.connect(spec, phone[1])
    assert "\n" not in str(e.value)


def test_a_named_serial_reaches_that_device_among_several(phone, monkeypatch):
    monkeypatch.setenv("FAKE_ADB_STATE", "two")
    dev = device.Device.connect("adb:FAKE123", phone[1])
    assert all(c[:2] == ["-s", "FAKE123"] for c in _calls(phone[0]))
    assert dev.label == "Pixel 9, arm64-v8a"


def test_bad_device_flags_are_one_line(phone, monkeypatch):
    for spec in ("usb", "adb:", "adb:a b"):
        with pytest.raises(ConfigError, match="give adb .* or adb:SERIAL"):
            device.parse(spec)
    with pytest.raises(ConfigError, match="needs --benchmark-binary PATH.*android_aarch64"):
        device.Device.connect("adb", "")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(device.DeviceError, match="adb is not installed or not on PATH"):
        device.Device.connect("adb", phone[1])


def test_export_benchmark_on_the_device_prints_its_figures(phone, tmp_path, capsys, monkeypatch):
    from tfopt.core._keras import keras, tf

    from tfopt.export.cli import main

    model = keras.Sequential(
        [keras.layers.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(3)]
    )
    path = tmp_path / "m.tflite"
    path.write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    argv = ["--benchmark", str(path), "--runs", "10", "--warmup", "1", "--threads", "1"]
    assert main([*argv, "--device", "adb", "--benchmark-binary", phone[1]]) == 0
    out = capsys.readouterr().out
    assert "device/1t" in out and "1.854" in out, out
    monkeypatch.setenv("FAKE_ADB_STATE", "unauthorized")
    assert main([*argv, "--device", "adb", "--benchmark-binary", phone[1]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Allow USB debugging" in err[0], err


@pytest.mark.slow
def test_an_export_timed_on_the_phone_ships_by_the_phones_figures(
    phone, mnist_run, tmp_path, monkeypatch, capsys
):
    from tfopt.export.cli import main

    # on this phone float32 is the fast one, whatever the host measured
    medians = {"model_float32.tflite": 500, "model_int8.tflite": 3000, "model_dynamic.tflite": 2500}
    monkeypatch.setenv("FAKE_ADB_MEDIANS", json.dumps(medians))
    out = tmp_path / "e"
    argv = ["--from", mnist_run, "--modes", "float32,dynamic,int8", "--eval-limit", "200"]
    argv += ["--runs", "10", "--warmup", "2", "--no-keras-latency", "--no-plot", "-o", str(out)]
    assert main([*argv, "--device", "adb", "--benchmark-binary", phone[1], "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "run.json").read_text())
    export = record["export"]
    assert export["device"] == "Pixel 9, arm64-v8a"
    phone_p50 = {r["mode"]: r["latency"]["device/1t"]["p50_ms"] for r in export["modes"]}
    assert phone_p50 == {"float32": 0.5, "dynamic": 2.5, "int8": 3.0}
    assert all(r["latency"]["device/1t"]["device"] == "Pixel 9, arm64-v8a" for r in export["modes"])
    passed = [r["mode"] for r in export["modes"] if r["gate"] is None or r["gate"]["passed"]]
    best = min(passed, key=phone_p50.get)
    assert export["ship"]["mode"] == best and export["ship"]["p50_ms"] == phone_p50[best]
    assert "p50 device/1t ms" in printed and "on Pixel 9, arm64-v8a" in printed, printed


def test_int8_autos_candidates_are_timed_on_the_phone(phone, monkeypatch):
    import numpy as np
    from test_export_auto import _small_model

    from tfopt.export import auto, benchmark, fidelity, ops
    from tfopt.export.evaluate import EvalResult

    def host_latency(*args, **kwargs):
        raise AssertionError("a candidate was timed on the host")

    monkeypatch.setattr(ops.OpRunner, "p50_ms", lambda self, runs, warmup: 0.01)
    monkeypatch.setattr(benchmark, "latency", host_latency)
    dev = device.Device.connect("adb", phone[1])
    calib = [np.random.default_rng(2).random((8, 12, 12, 1), dtype=np.float32)]
    found = auto.search(
        _small_model(),
        calib,
        lambda content: EvalResult(
            100, 0.9, keras_accuracy=0.9, accuracy_delta_pt=0.0, agreement=1.0
        ),
        fidelity.Thresholds(),
        threads=(1, 2),
        rounds=2,
        runs=7,
        warmup=3,
        time_fn=lambda content, t: dev.p50(content, t, runs=7, warmup=3),
    )
    runs = [c[1] for c in _calls(phone[0]) if c[0] == "shell" and "--graph=" in c[1]]
    assert len(runs) == len(found.candidates) * 2 * 2  # every candidate, round and thread count
    assert {r.split()[2] for r in runs} == {"--num_threads=1", "--num_threads=2"}
    assert all(c.rounds_by_threads == {1: [1.854] * 2, 2: [1.854] * 2} for c in found.candidates)
    assert found.chosen == 0  # a tie on the phone keeps plain int8
