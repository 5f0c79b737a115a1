"""Backups in process: the NaN guard's roll-back, a full disk, debris of a killed write."""

import glob
import os
import subprocess
import sys
import textwrap

from tfopt.core._keras import keras, tf

import numpy as np
import pytest

from tfopt import config as C
from tfopt.core.errors import TrainingError
from tfopt.runtime.backup import remove_debris
from tfopt.runtime.job import Job


def _cfg(out, **train):
    return C.from_dict(
        {
            "data": {"dataset": "digits", "global_batch_size": 32, "num_shards": 2},
            "runtime": {"strategy": "one_device"},
            "train": {
                "epochs": 2,
                "output_dir": str(out),
                "verbose": 0,
                "tensorboard": False,
                "backup_every": 10,
                "lr_schedule": "constant",
                **train,
            },
        }
    )


class PoisonAt(keras.callbacks.Callback):
    """Sets one kernel weight to NaN after global step ``step`` (the first ``times`` times it gets there)."""

    def __init__(self, step, spe, times):
        super().__init__()
        self.step, self.spe, self.times, self.epoch, self.done = step, spe, times, 0, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch * self.spe + batch + 1 == self.step and self.done < self.times:
            self.done += 1
            kernel = self.model.layers[-1].kernel
            kernel.assign(tf.tensor_scatter_nd_update(kernel, [[0, 0]], [np.nan]))


def _fit(out, times, **train):
    cfg = _cfg(out, **train)
    with Job(cfg, "train") as job:
        steps = job.steps_per_epoch()
        with job.strategy.scope():
            model = keras.Sequential(
                [
                    keras.Input(job.info.image_shape),
                    keras.layers.Flatten(),
                    keras.layers.Dense(job.info.num_classes),
                ]
            )
            model.compile(
                optimizer=job.optimizer(job.learning_rate(), 2 * steps),
                metrics=["accuracy"],
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                steps_per_execution=1,
            )
        job.fit(model, [PoisonAt(15, steps, times)], epochs=2, steps_per_epoch=steps)
        backups = sorted(glob.glob(os.path.join(job.run_dir.work, "backup", "0", "ckpt-*.index")))
        return job, model, backups


@pytest.mark.slow
def test_a_nan_rolls_back_to_the_last_backup_with_a_lower_rate(tmp_path):
    job, model, backups = _fit(tmp_path / "run", times=1)
    assert job.rollbacks == 1 and float(job._lr_scale.numpy()) == 0.5
    assert all(np.isfinite(w).all() for w in model.get_weights())
    assert (
        int(model.optimizer.iterations.numpy()) == 2 * job.steps_per_epoch()
    )  # the planned steps, no more
    for index in backups:  # no backup ever holds a non-finite weight
        reader = tf.train.load_checkpoint(index[: -len(".index")])
        for name in reader.get_variable_to_shape_map():
            value = reader.get_tensor(name)
            if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                assert np.isfinite(value).all(), (index, name)


@pytest.mark.slow
def test_a_nan_after_every_roll_back_stops_with_the_step(tmp_path):
    with pytest.raises(
        TrainingError,
        match=r"the loss \(nan\) is not finite at step 16 after 2 roll-back\(s\) "
        r"\(train.nan_retries=2\); lower --lr",
    ):
        _fit(tmp_path / "run", times=99)


def test_debris_of_a_killed_write_is_removed(tmp_path):
    (tmp_path / "ckpt-20_temp").mkdir()
    (tmp_path / "ckpt-20_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"torn")
    (tmp_path / "ckpt-10.index").write_bytes(b"kept")
    remove_debris(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["ckpt-10.index"]


@pytest.mark.slow
@pytest.mark.parametrize("every", [1, 0], ids=["every-step-compiled", "epoch-end-eager"])
def test_backups_keep_the_two_newest_and_survive_a_moved_directory(tmp_path, every):
    from tfopt.runtime.backup import Backup

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(tf.ones((8, 8)), tf.ones((8, 4)), verbose=0)
    d = tmp_path / "backup"
    backup = Backup(
        model,
        str(d),
        steps_per_epoch=100,
        every=every,
        chief=True,
        scratch=str(tmp_path / "scratch"),
        strategy=tf.distribute.get_strategy(),
    )
    backup.set_model(model)
    for step in (
        1,
        2,
        3,
        3,
    ):  # the last one rewrites step 3 (a preemption right after a periodic backup)
        for w in model.weights:
            w.assign(tf.fill(w.shape, float(step)))
        backup.step = step
        backup.save()
    if every:  # frequent backups: the write is traced once, not walked in Python per backup
        assert backup._write.experimental_get_tracing_count() == 1
    assert {p.name.split(".")[0] for p in d.iterdir()} == {
        "checkpoint",
        "ckpt-2",
        "ckpt-3",
    }  # the two newest
    assert (d / "checkpoint").read_text().splitlines() == [
        'model_checkpoint_path: "ckpt-3"',
        'all_model_checkpoint_paths: "ckpt-2"',
        'all_model_checkpoint_paths: "ckpt-3"',
    ]
    moved = tmp_path / "moved"  # e.g. a volume mounted elsewhere after a restart
    os.rename(d, moved)
    for w in model.weights:
        w.assign(tf.zeros(w.shape))
    again = Backup(
        model,
        str(moved),
        steps_per_epoch=100,
        every=1,
        chief=True,
        scratch=str(tmp_path / "scratch"),
        strategy=tf.distribute.get_strategy(),
    )
    assert again.restore() == 3
    assert {float(v) for w in model.get_weights() for v in w.ravel()} == {3.0}


FULL_DISK = textwrap.dedent("""
    import os, subprocess, sys
    from tfopt.core._keras import keras, tf
    from tfopt.core.errors import TfoptError
    from tfopt.runtime.backup import Backup
    d = sys.argv[1]
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(tf.ones((8, 8)), tf.ones((8, 4)), verbose=0)
    backup = Backup(model, d, steps_per_epoch=100, every=10, chief=True, scratch="/tmp",
                    strategy=tf.distribute.get_strategy())
    backup.set_model(model)
    backup.step = 10
    backup.save()
    fd = os.open(os.path.join(d, "filler"), os.O_WRONLY | os.O_CREAT)
    try:  # fill the disk
        while True:
            os.write(fd, b"x" * 4096)
    except OSError:
        os.close(fd)
    model.layers[0].kernel.assign(tf.zeros((8, 4)))
    backup.step = 20
    try:
        backup.save()
    except TfoptError as e:
        print("ERROR", e)
    os.unlink(os.path.join(d, "filler"))
    model.layers[0].kernel.assign(tf.ones((8, 4)))
    print("RESTORED", backup.restore(), float(model.layers[0].kernel.numpy().sum()))
""")


@pytest.mark.slow
def test_a_full_disk_gives_a_clear_error_and_keeps_the_previous_backup(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    script = tmp_path / "full.py"
    script.write_text(FULL_DISK)
    cmd = [
        "unshare",
        "-m",
        "sh",
        "-c",
        'mount -t tmpfs -o size=256k tmpfs "$1" && exec "$0" "$2" "$1"',
        sys.executable,
        str(mount),
        str(script),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    error = next(line for line in result.stdout.splitlines() if line.startswith("ERROR"))
    assert (
        f"cannot write a backup to {mount} at step 20" in error
        and "the previous backup is intact" in error
    )
    assert "No space left on device" in error, error  # the reason, not "Graph execution error:"
    restored = next(
        line for line in result.stdout.splitlines() if line.startswith("RESTORED")
    ).split()
    assert (
        restored[1] == "10" and float(restored[2]) != 32.0
    )  # step 10's weights, not the ones after it


WRITER = textwrap.dedent("""
    import json, os, sys
    from tfopt.core._keras import keras, tf
    from tfopt.runtime.backup import Backup
    d, mode = sys.argv[1], sys.argv[2]
    model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(512)])  # 1 MB of weights per backup
    model.compile(optimizer="adam", loss="mse")
    backup = Backup(model, d, steps_per_epoch=10**6, every=1, chief=True, scratch="/tmp",
                    strategy=tf.distribute.get_strategy())
    backup.set_model(model)
    if mode == "write":  # back up step s with every weight equal to s, as fast as possible, until killed
        step = backup.restore()
        while True:
            step += 1
            for w in model.weights:
                w.assign(tf.fill(w.shape, float(step)))
            backup.step = step
            backup.save()
            print(step, flush=True)
    step = backup.restore()
    values = {float(v) for w in model.get_weights() for v in w.ravel()[[0, -1]]}
    print("RESTORED", json.dumps({"step": step, "values": sorted(values)}))
""")


@pytest.mark.slow
def test_a_kill_during_a_backup_write_leaves_the_previous_backup_usable(tmp_path):
    """kill -9 at random moments of back-to-back writes: the newest complete backup restores, whole."""
    import json
    import random
    import time

    script, d = tmp_path / "writer.py", tmp_path / "backup"
    script.write_text(WRITER)
    rng = random.Random(0)
    for kill in range(4):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(d), "write"], stdout=subprocess.PIPE, text=True
        )
        first = int(proc.stdout.readline())  # one backup completed in this process
        time.sleep(rng.uniform(0.05, 0.6))
        proc.kill()
        done = [first] + [int(line) for line in proc.stdout.read().split()]
        proc.wait()
        result = subprocess.run(
            [sys.executable, str(script), str(d), "check"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        line = next(x for x in result.stdout.splitlines() if x.startswith("RESTORED"))
        restored = json.loads(line.split(" ", 1)[1])
        step, values = restored["step"], restored["values"]
        print(f"kill {kill}: last completed write step {done[-1]}, restored step {step}")
        assert step in (
            done[-1],
            done[-1] + 1,
        )  # the last one reported, or the one the kill cut after its commit
        assert values == [float(step)]  # whole: every weight of that step, none of another
