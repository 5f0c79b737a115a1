"""GPipe pipeline parallelism (tfopt.runtime.gpipe): partitions, placement, and steps equal to the
unsplit model's."""

import json

from tfopt.core._keras import keras, tf

import numpy as np
import pytest

from tfopt.core.errors import ConfigError
from tfopt.runtime import gpipe

CPUS = ["/device:CPU:0", "/device:CPU:1"]


def residual_cnn(seed: int = 0) -> keras.Model:
    """A functional model with a residual block (no cut inside it) and a TF op layer."""
    keras.utils.set_random_seed(seed)
    i = keras.Input((12, 12, 1))
    x = keras.layers.Conv2D(6, 3, activation="relu", name="c1")(i)
    y = keras.layers.Conv2D(6, 3, padding="same", name="c2")(x)
    x = keras.layers.Add(name="res")([x, y])
    x = keras.layers.MaxPool2D(name="pool")(x)
    x = keras.layers.Flatten(name="flat")(x)
    x = keras.layers.Dense(16, activation="relu", name="d1")(x)
    x = tf.nn.relu(x * 2.0)
    return keras.Model(i, keras.layers.Dense(10, name="d2")(x), name="residual_cnn")


def sequential_mlp(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((20,)),
            keras.layers.Dense(64, activation="relu", name="h1"),
            keras.layers.Dense(64, activation="tanh", name="h2"),
            keras.layers.Dense(32, activation="relu", name="h3"),
            keras.layers.Dense(5, name="out"),
        ],
        name="mlp",
    )


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _data(model, n=48, classes=10):
    rng = np.random.default_rng(1)
    x = rng.random((n, *model.input_shape[1:]), dtype=np.float32)
    return x, rng.integers(0, model.output_shape[-1], n)


def _pipelined(model, stages, microbatches, remat=False, devices=None, schedule="gpipe", **kw):
    part = gpipe.partition(model, stages, **kw)
    devices = devices or [CPUS[k % 2] for k in range(stages)]
    built = gpipe.build_stages(model, part, devices)
    return gpipe.Pipelined(built, devices, microbatches, remat, part, schedule)


def test_cut_points_are_where_one_tensor_crosses_and_a_branch_is_refused_naming_its_layers():
    graph = gpipe.stages._Graph(residual_cnn())
    # TF-op layers are named by how many came before in the process: read theirs.
    ops = [layer.name for layer in graph.model.layers if layer.name.startswith("tf.")]
    order = ["c1", "c2", "res", "pool", "flat", "d1", *ops, "d2"]
    assert graph.order == order and len(ops) == 2
    # Not after c2: c1's output and c2's both reach the Add; not after the last layer.
    assert [graph.order[i] for i in graph.cuts()] == [n for n in order[:-1] if n != "c2"]
    with pytest.raises(ConfigError, match="layers c1, c2 cross that boundary"):
        gpipe.partition(residual_cnn(), 2, cut_after=["c2"])
    with pytest.raises(ConfigError, match="'nope' is not a layer"):
        gpipe.partition(residual_cnn(), 2, cut_after=["nope"])
    with pytest.raises(ConfigError, match="at most 8 stages"):
        gpipe.partition(residual_cnn(), 9)


def test_balance_minimizes_the_costliest_stage_against_brute_force():
    import itertools

    model = sequential_mlp()
    params = [model.get_layer(n).count_params() for n in ("h1", "h2", "h3", "out")]
    for k in (2, 3):
        part = gpipe.partition(model, k, by="params")
        best = min(
            max(sum(params[a:b]) for a, b in zip((0, *cut), (*cut, 4), strict=True))
            for cut in itertools.combinations(range(1, 4), k - 1)
        )
        assert max(part.costs) == best and sum(part.costs) == sum(params)
        assert [n for s in part.stages for n in s] == ["h1", "h2", "h3", "out"]
    from tfopt.compress.flops import layer_macs

    flops = gpipe.partition(residual_cnn(), 2, by="flops", macs=layer_macs)
    assert flops.stages[0][-1] in ("c1", "res") and flops.by == "flops"


def convs_then_wide_dense(seed: int = 0) -> keras.Model:
    """Two equal convolutions on a 48x48 image (few weights, most of the work) before wide Dense
    layers (most of the weights, little work): parameters and time disagree about where to cut."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((48, 48, 3)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv1"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv3"),
            keras.layers.GlobalAveragePooling2D(name="pool"),
            keras.layers.Dense(1024, activation="relu", name="wide1"),
            keras.layers.Dense(1024, activation="relu", name="wide2"),
            keras.layers.Dense(10, name="out"),
        ],
        name="convs_then_dense",
    )


def test_time_balance_times_each_piece_and_cuts_where_the_work_is_not_where_the_weights_are():
    from tfopt.compress.flops import layer_macs
    from tfopt.runtime.gpipe.cost import piece_seconds

    model = convs_then_wide_dense()
    x, _ = _data(model, n=32)
    seconds = piece_seconds(model, x, repeats=3)
    # A Sequential model can be cut after every layer: every layer ends a piece.
    assert list(seconds) == [layer.name for layer in model.layers]
    assert all(s > 0 for s in seconds.values())
    # conv2 and conv3 do ~10x the multiply-adds of everything else, the Dense layers hold ~100x
    # their weights: time (like multiply-adds, unlike parameters) cuts between the two convolutions
    # (the other cuts leave a stage ~1.6x costlier here).
    by_time = gpipe.partition(model, 2, by="time", seconds=seconds)
    assert by_time.stages[0] == ("conv1", "conv2") and by_time.by == "time"
    assert by_time.stages == gpipe.partition(model, 2, by="flops", macs=layer_macs).stages
    assert gpipe.partition(model, 2, by="params").stages[0][-1] == "wide1"
    assert sum(by_time.costs) == pytest.approx(sum(seconds.values()))
    # What a resumed run reads back is the same partition.
    assert gpipe.Partition.from_dict(json.loads(json.dumps(by_time.to_dict()))) == by_time
    with pytest.raises(TypeError, match="needs seconds="):
        gpipe.partition(model, 2, by="time")


def test_each_stage_lives_on_its_device():
    pipelined = _pipelined(residual_cnn(), 2, 4)
    for stage, device in zip(pipelined.stages, CPUS, strict=True):
        assert stage.variables and all(v.device.endswith(device) for v in stage.variables)
    assert pipelined.stages[1].variables[0].device.endswith("CPU:1")


@pytest.mark.parametrize("schedule", gpipe.SCHEDULES)
@pytest.mark.parametrize("remat", [False, True])
@pytest.mark.parametrize("make,stages,microbatches", [(residual_cnn, 2, 4), (sequential_mlp, 3, 5)])
def test_gradients_equal_the_unsplit_models(make, stages, microbatches, remat, schedule):
    model = make()
    x, y = _data(model, n=22)  # 22 examples in 4 or 5 micro-batches: unequal parts
    with tf.GradientTape() as tape:
        loss = LOSS(y, model(x, training=True))
    reference = tape.gradient(loss, model.trainable_variables)
    pipelined = _pipelined(model, stages, microbatches, remat, schedule=schedule)
    pipelined.compile(keras.optimizers.SGD(0.01), LOSS)
    predictions, grads = pipelined.gradients(tf.constant(x), tf.constant(y))
    loss_p = LOSS(y, predictions)
    assert float(loss_p) == pytest.approx(float(loss), rel=1e-6)
    assert len(grads) == len(reference)
    for g, r in zip(grads, reference, strict=True):
        np.testing.assert_allclose(
            g.numpy(), r.numpy(), rtol=1e-4, atol=1e-6 * float(np.abs(r).max())
        )


def test_1f1b_runs_each_stages_passes_in_its_order():
    from tfopt.runtime.gpipe.schedule import one_f_one_b

    order = one_f_one_b(3, 4)
    assert order[0] == [
        ("F", 0),
        ("F", 1),
        ("F", 2),
        ("B", 0),
        ("F", 3),
        ("B", 1),
        ("B", 2),
        ("B", 3),
    ]
    assert order[2] == [
        ("F", 0),
        ("B", 0),
        ("F", 1),
        ("B", 1),
        ("F", 2),
        ("B", 2),
        ("F", 3),
        ("B", 3),
    ]
    for k, passes in enumerate(order):
        assert sorted(passes) == sorted([("F", m) for m in range(4)] + [("B", m) for m in range(4)])
        held = max(
            sum(1 for p in passes[: i + 1] if p[0] == "F")
            - sum(1 for p in passes[: i + 1] if p[0] == "B")
            for i in range(len(passes))
        )
        assert held == 3 - k  # at most K-k micro-batches in flight, whatever M


@pytest.mark.parametrize("schedule,remat", [("gpipe", False), ("gpipe", True), ("1f1b", False)])
def test_training_steps_give_the_unsplit_models_weights(schedule, remat):
    model = residual_cnn()
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    pipelined = _pipelined(model, 2, 4, remat, schedule=schedule)
    for m in (reference, pipelined):
        m.compile(keras.optimizers.SGD(0.01, momentum=0.9), LOSS, metrics=["accuracy"])
    x, y = _data(model, n=64)
    h_ref = reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    h_pipe = pipelined.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    gpipe.copy_weights_back(pipelined, model)
    for a, b in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(h_pipe.history["loss"], h_ref.history["loss"], rtol=1e-5)
    assert h_pipe.history["accuracy"] == h_ref.history["accuracy"]
    # 8 steps moved the weights: equal weights are not the untouched start.
    assert (
        max(
            float(np.abs(a - b).max())
            for a, b in zip(model.get_weights(), residual_cnn().get_weights(), strict=True)
        )
        > 1e-3
    )
    np.testing.assert_allclose(
        pipelined.predict(x, verbose=0), reference.predict(x, verbose=0), rtol=1e-4, atol=1e-5
    )


def test_models_that_cannot_be_split_are_refused_in_one_line():
    class Sub(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(ConfigError, match="subclassed keras.Model"):
        gpipe.partition(Sub(), 2)
    i = keras.Input((4,))
    shared = keras.layers.Dense(4, name="shared")
    with pytest.raises(ConfigError, match="layer 'shared' .* called 2 times"):
        gpipe.partition(keras.Model(i, shared(shared(i))), 2)
    a, b = keras.Input((4,)), keras.Input((4,))
    with pytest.raises(ConfigError, match="2 inputs"):
        gpipe.partition(keras.Model([a, b], keras.layers.Add()([a, b])), 2)
    with pytest.raises(ConfigError, match="--stages 3 needs 3 devices .* --cpu-replicas 3"):
        gpipe.stage_devices(3)
    with pytest.raises(ConfigError, match="--microbatches 0"):
        gpipe.Pipelined([], [], 0)
    small = _pipelined(sequential_mlp(), 2, 8)
    with pytest.raises(tf.errors.InvalidArgumentError, match="smaller than the 8 micro-batches"):
        small.pipelined_forward(tf.zeros((5, 20)))


TRAIN = ["--model", "model_factory:small_net", "--epochs", "2", "--limit", "1200"]
TRAIN += ["--backup-every", "2", "--deterministic", "--quiet"]
PIPELINE = ("--strategy", "pipeline", "--stages", "3", "--microbatches", "5", "--remat")
PIPELINE += ("--pipeline-schedule", "1f1b")


def _train_cmd(out, *argv):
    import sys

    return [sys.executable, "-m", "tfopt.train", *TRAIN, "-o", str(out), *argv]


def _env():
    import os

    return {**os.environ, "PYTHONPATH": os.path.dirname(__file__)}


def _train(out, *argv):
    import subprocess

    cmd = _train_cmd(out, *argv)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())


def _preempted_then_resumed(out, *argv) -> str:
    """Trains, SIGTERM after the backup of step 4 or later, trains again; the second run's log."""
    import os
    import re
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(
        _train_cmd(out, *argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
    )
    state = os.path.join(f"{out}.partial", "backup", "0", "checkpoint")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        m = os.path.exists(state) and re.search(r'ckpt-(\d+)"', open(state).read())
        if m and int(m.group(1)) >= 4:
            break
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)  # a backup at the next step, then exit 143
    assert proc.communicate(timeout=120) and proc.returncode == 143
    r = _train(out, *argv)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stderr


@pytest.mark.slow
def test_tfopt_train_pipeline_equals_one_device_resumes_exactly_and_records_its_split(tmp_path):
    import json
    import re

    weights = {}
    for name, argv in (("pipeline", PIPELINE), ("one_device", ("--strategy", "one_device"))):
        r = _train(tmp_path / name, *argv)
        assert r.returncode == 0, r.stderr[-3000:]
        weights[name] = keras.models.load_model(tmp_path / name / "model.keras").get_weights()
    for a, b in zip(weights["pipeline"], weights["one_device"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    record = json.load(open(tmp_path / "pipeline" / "run.json"))
    split = record["train"]["pipeline"]
    assert [s["device"][-5:] for s in split["stages"]] == ["CPU:0", "CPU:1", "CPU:2"]
    assert split["microbatches"] == 5 and split["remat"] is True and split["schedule"] == "1f1b"
    assert split["bubble_formula"] == pytest.approx(2 / 7)
    assert split["balanced_by"] == "time" and all(s["cost"] > 0 for s in split["stages"])
    # Killed after a backup and started again: the uninterrupted run's weights, bit for bit.
    log = _preempted_then_resumed(tmp_path / "resumed", *PIPELINE)
    assert int(re.search(r"resuming at step (\d+)", log).group(1)) >= 4
    assert "cut where the interrupted run cut (balanced by time)" in log, log[-3000:]
    resumed = json.load(open(tmp_path / "resumed" / "run.json"))
    assert resumed["weights_sha256"] == record["weights_sha256"]


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ("--strategy", "mirrored", "--stages", "3"),
            "--stages is not used by --strategy mirrored",
        ),
        (("--strategy", "pipeline", "--freeze-epochs", "1"), "drop --freeze-epochs"),
        (("--strategy", "pipeline", "--batch-size", "4"), "give --batch-size 8 or more"),
        (("--strategy", "pipeline", "--dp-noise", "1.0", "--dp-l2-clip", "1"), "drop --dp-l2-clip"),
        (
            ("--strategy", "pipeline", "--balance", "size"),
            "'size' is not valid; choose one of time, params",
        ),
        (("--strategy", "pipeline", "--cut-after", "nope"), "'nope' is not a layer"),
        (("--strategy", "pipeline", "--device-memory-mib", "-1"), "must be >= 0"),
        (
            ("--strategy", "pipeline", "--stages", "1", "--device-memory-mib", "1"),
            "stage 1 of 1 (conv2d..probs) needs",
        ),
    ],
)
def test_bad_pipeline_settings_are_one_line(tmp_path, argv, message):
    r = _train(tmp_path / "run", *argv)
    assert r.returncode == 2, r.stderr[-2000:]
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "run" / "run.json").exists()


def test_stages_that_do_not_split_a_model_refuse_the_pipeline_strategy():
    from tfopt import config as C
    from tfopt.runtime.job import Job

    cfg = C.from_dict({"runtime": {"strategy": "pipeline"}})
    for stage in ("distill", "optimize"):
        with pytest.raises(ConfigError, match=f"tfopt {stage} does not split it yet"):
            Job(cfg, stage)


def test_the_measurement_reports_each_stages_time_and_peak_memory_below_the_unsplit_models():
    from tfopt.runtime.gpipe.measure import measure

    keras.utils.set_random_seed(0)
    i = keras.Input((28, 28, 1))
    x = i
    for width in (16, 32, 32, 64):
        x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
    model = keras.Model(i, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x)))
    pipelined = _pipelined(model, 2, 4)
    before = [w.copy() for w in model.get_weights()]
    x, y = _data(model, n=64)
    pipelined.compile(keras.optimizers.SGD(0.01), LOSS)
    m = measure(pipelined, x, y, repeats=2)
    assert m["batch"] == 64 and len(m["stage_seconds"]) == 2 and m["step_seconds"] > 0
    assert m["bubble_formula"] == pytest.approx(1 / 5)
    assert m["bubble_measured"] == pytest.approx(
        1 - sum(m["stage_seconds"]) / (2 * m["step_seconds"])
    )
    # Each stage holds only its own layers' activations: less than the whole model on the batch.
    assert 0 < max(m["stage_peak_bytes"]) < m["unsplit_peak_bytes"]
    assert 0 < max(m["stage_peak_bytes_remat"]) < m["unsplit_peak_bytes"]
    # Measuring applies no gradient.
    gpipe.copy_weights_back(pipelined, model)
    for a, b in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_stage_holds_its_micro_batches_activations_and_a_budget_refuses_a_stage_over_it():
    from tfopt.runtime.gpipe.measure import check_budget, stage_peaks

    keras.utils.set_random_seed(0)
    i = keras.Input((28, 28, 1))
    x = keras.layers.BatchNormalization(name="bn")(i)
    for n, width in enumerate((16, 32, 32, 64)):
        x = keras.layers.Conv2D(width, 3, padding="same", activation="relu", name=f"c{n}")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    model = keras.Model(i, keras.layers.Dense(10, name="logits")(x))
    x, _ = _data(model, n=64)

    def held(split, k):  # the stage's convolutions' outputs on the whole batch, computed apart
        names = split.partition.stages[k]
        return sum(
            64 * np.prod(model.get_layer(n).output_shape[1:]) * 4 for n in names if n[0] == "c"
        )

    cut = {"cut_after": ["c1"]}
    one, two = _pipelined(model, 1, 4), _pipelined(model, 2, 4, **cut)
    before = [w.copy() for w in two.get_weights()]
    whole, halves = stage_peaks(one, x), stage_peaks(two, x)
    # GPipe: every micro-batch's activations are held until the backward passes start.
    assert whole[0] >= held(one, 0) and all(halves[k] >= held(two, k) for k in range(2))
    assert max(halves) < whole[0]
    recomputed = stage_peaks(_pipelined(model, 2, 4, remat=True, **cut), x)
    assert all(r < held(two, k) for k, r in enumerate(recomputed))
    # 1F1B: the last stage holds one micro-batch of the four.
    assert stage_peaks(_pipelined(model, 2, 4, schedule="1f1b", **cut), x)[1] < held(two, 1)
    budget = (max(halves) + whole[0]) / 2 / 2**20
    with pytest.raises(ConfigError, match=r"stage 1 of 1 \(bn\.\.logits\) needs"):
        check_budget(one, x, budget)
    assert max(check_budget(two, x, budget)) <= budget * 2**20
    # Training-mode passes moved the BatchNormalization statistics; the weights are put back.
    for a, b in zip(two.get_weights(), before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_cluster_is_refused_in_one_line_saying_why_the_stages_cannot_go_into_its_workers():
    import json

    from tfopt.core.errors import ClusterError
    from tfopt.runtime.tf_config import parse_tf_config, validate_for_strategy

    cluster = {"worker": ["localhost:1", "localhost:2"]}
    info = parse_tf_config(json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    with pytest.raises(
        ClusterError, match="mirror every variable onto each replica's one device"
    ) as e:
        validate_for_strategy(info, "pipeline")
    assert "\n" not in str(e.value)


def test_under_mixed_bfloat16_the_stages_pass_bfloat16_and_the_gradients_match_the_unsplit_model():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = residual_cnn()
        x, y = _data(model, n=16)
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        reference = tape.gradient(loss, model.trainable_variables)
        pipelined = _pipelined(model, 2, 4)
        assert pipelined.stages[1].inputs[0].dtype == tf.bfloat16
        with tf.GradientTape() as tape:
            loss_p = LOSS(y, pipelined.pipelined_forward(tf.constant(x)))
        grads = tape.gradient(loss_p, pipelined.trainable_variables)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert all(v.dtype == tf.float32 for v in pipelined.trainable_variables)
    for g, r in zip(grads, reference, strict=True):
        np.testing.assert_allclose(
            g.numpy(), r.numpy(), rtol=0.05, atol=0.02 * float(np.abs(r).max())
        )
