"""The Keras model's own latency (the float baseline of every .tflite): one child process per thread
count, started with TF_NUM_INTRAOP_THREADS=N / TF_NUM_INTEROP_THREADS=1; its weight bytes."""

import json
import os
import subprocess
import sys

from tfopt.core._keras import keras

import pytest

from tfopt.core.errors import ConfigError, ModelError
from tfopt.export import benchmark, keras_latency

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1), name="image")
    h = keras.layers.Conv2D(4, 3, activation="relu", name="conv0")(inputs)
    h = keras.layers.BatchNormalization(name="bn0")(h)
    return keras.Model(
        inputs, keras.layers.Dense(10, name="logits")(keras.layers.Flatten(name="flatten")(h))
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("keras_latency") / "model.keras")
    _model().save(path)
    return path


def test_weights_bytes_counts_every_variable_once_at_its_dtype():
    model = _model()
    # every weight is float32: trainable and BatchNormalization's moving statistics alike
    assert benchmark.weights_bytes(model) == 4 * model.count_params()
    assert benchmark.weights_bytes(model) == sum(w.nbytes for w in model.get_weights())


@pytest.mark.slow
def test_latency_per_thread_count_in_child_processes(saved):
    lat = benchmark.keras_latency(saved, threads=(1, 2), runs=10, warmup=2)
    assert list(lat) == ["1t", "2t"]
    for key, threads in (("1t", 1), ("2t", 2)):
        r = lat[key]
        assert (
            r["threads"] == threads
            and r["inter_op_threads"] == 1
            and r["runs"] == 10
            and r["warmup"] == 2
        )
        assert 0 < r["min_ms"] <= r["p50_ms"] <= r["p95_ms"] and r["mean_ms"] > 0


@pytest.mark.slow
def test_module_prints_one_json_line_and_errors_are_one_line(saved, tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfopt.export.keras_latency",
            saved,
            "--threads",
            "1",
            "--runs",
            "3",
            "--warmup",
            "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["threads"] == 1
    assert "cuInit" not in proc.stderr  # start-up notices are filtered
    bad = subprocess.run(
        [sys.executable, "-m", "tfopt.export.keras_latency", str(tmp_path / "missing.keras")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        bad.returncode == 2
        and len(bad.stderr.strip().splitlines()) == 1
        and "does not exist" in bad.stderr
    )


def test_bad_settings_fail_before_a_child_starts():
    with pytest.raises(ConfigError, match="runs=0 must be >= 1"):
        keras_latency.measure("x.keras", threads=1, runs=0)
    with pytest.raises(ConfigError, match="threads=0"):
        benchmark.keras_latency("x.keras", threads=(0,))


@pytest.mark.slow
def test_a_failing_child_is_a_one_line_model_error(tmp_path):
    (tmp_path / "broken.keras").write_bytes(b"not a zip")
    with pytest.raises(ModelError) as e:
        keras_latency.measure(str(tmp_path / "broken.keras"), runs=1, warmup=0)
    assert "timing the Keras model" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_a_started_timer_waits_idle_until_told_and_a_closed_one_leaves_no_child(saved, tmp_path):
    import time

    def cpu_ticks(pid):  # utime + stime of /proc/PID/stat
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    keras_latency._stop_idle_children()
    with keras_latency.Timer(saved, threads=1, runs=5, warmup=1) as timer:
        timer.ready()  # TensorFlow started and the model loaded: now it only waits
        pid = timer.pid
        before = cpu_ticks(pid)
        time.sleep(1.0)
        # waiting costs the cores nothing (a busy child would skew the parent's own timings)
        assert cpu_ticks(pid) - before <= 2  # ticks of 10 ms
        r = timer.result()
    assert r["runs"] == 5 and r["threads"] == 1 and 0 < r["min_ms"] <= r["p50_ms"]
    # The next Timer at 1 thread reuses the idle child (TensorFlow runs already) for another model.
    other = str(tmp_path / "other.keras")
    keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]).save(other)
    with keras_latency.Timer(other, threads=1, runs=2, warmup=0) as again:
        assert again.pid == pid
        again.ready()
        before = cpu_ticks(pid)
        time.sleep(1.0)
        assert cpu_ticks(pid) - before <= 2  # idle again once the small model is loaded
        assert again.result()["runs"] == 2
    unused = keras_latency.Timer(saved, threads=1, runs=1, warmup=0)
    assert unused.pid == pid
    child = unused._child
    unused.ready()
    unused.close()
    assert (
        child.proc.returncode is not None and 1 not in keras_latency._IDLE
    )  # stopped, never timed
    # An idle child that died is replaced by a new one.
    keras_latency.measure(saved, threads=1, runs=1, warmup=0)
    dead = keras_latency._IDLE[1].proc
    dead.kill()
    dead.wait()
    with keras_latency.Timer(saved, threads=1, runs=2, warmup=0) as fresh:
        assert fresh.pid != dead.pid and fresh.result()["runs"] == 2
