"""Progress lines show metrics on their true scale under a real 2-worker MultiWorkerMirroredStrategy.

A step's metric results are already all-reduced (metric variables are sync-on-read), yet
tf_keras's default reduction of a step's outputs ("auto": "sum" off TPU) summed them again over
the replicas under MultiWorkerMirroredStrategy: the per-step progress figures came out times the
replica count (``accuracy: 1.97`` on 2 workers) while the epoch-end figures, read from the metric
objects, and the history were right. ``Job.fit`` takes one replica's copy ("first").
"""

import json
import re
import subprocess
import sys

import pytest
from isolation import ISOLATED

# One progress-bar update: "32/32 [====] - ETA: 0s - loss: 0.9381 - accuracy: 0.6895" (a
# per-step update: the figures the train function returned) or "32/32 [====] - 1s 38ms/step -
# loss: ... - val_accuracy: ..." (the epoch's end: the metric objects' results). An epoch's
# updates share one line, each after a carriage return (and backspaces); Keras prints every
# value with 4 decimals (%.4f, or %.4e at most 1e-3).
_VALUE = r"-?\d+\.\d{4}(?:e[+-]\d+)?|nan|-?inf"
_UPDATE = re.compile(
    r"(?P<step>\d+)/(?P<total>\d+) \[[=>.]+\] - (?P<time>ETA: \S+|\d+\w*(?: \d+\w+/step)?)"
    rf"(?P<metrics>(?: - \w+: (?:{_VALUE}))*)"
)
_METRIC = re.compile(rf"(\w+): ({_VALUE})")
_ANY_ACCURACY = re.compile(rf"\b(?:val_)?accuracy: ({_VALUE})")

STEPS = 32  # per epoch, and per tf.function call: one per-step update per epoch, see below


def _keras_format(value: float) -> str:
    """``value`` as the progress bar prints it (tf_keras's Progbar)."""
    return f"{value:.4f}" if abs(value) > 1e-3 else f"{value:.4e}"


def _epochs(stdout: str) -> list[list[dict]]:
    """The chief's progress updates, one list per epoch: {"step", "total", "eta", metric: text}."""
    epochs: list[list[dict]] = []
    for line in stdout.split("\n"):  # not splitlines(): it would split at the carriage returns
        if not line.startswith("[worker:0] "):
            continue
        line = line[len("[worker:0] ") :]
        if re.fullmatch(r"Epoch \d+/\d+", line.strip()):
            epochs.append([])
            continue
        for m in _UPDATE.finditer(line):
            update = {
                "step": int(m["step"]),
                "total": int(m["total"]),
                "eta": m["time"].startswith("ETA"),
            }
            update.update(dict(_METRIC.findall(m["metrics"])))
            epochs[-1].append(update)
    return epochs


@pytest.mark.slow
def test_multi_worker_mirrored_progress_shows_true_metrics(tmp_path):
    out = tmp_path / "run"
    cmd = [
        *ISOLATED,
        sys.executable,
        "-m",
        "tfopt.launch",
        "--workers",
        "2",
        "--timeout",
        "120",
        "--",
        sys.executable,
        "-m",
        "tfopt.train",
        "--strategy",
        "multi_worker_mirrored",
        "--dataset",
        "digits",  # scikit-learn's, no download
        "--model",
        "mlp",
        "--lr",
        "0.01",  # above 50% train accuracy in the first epoch: a doubled figure exceeds 1
        "--batch-size",
        "32",
        # The progress bar skips an update within 50 ms of the one before (not the epoch's
        # end), so a second per-step update of an epoch shows or not by timing. One call per
        # epoch: its update is the first of the epoch's bar, always shown, and covers the epoch.
        "--steps-per-epoch",
        str(STEPS),
        "--steps-per-execution",
        str(STEPS),
        "--epochs",
        "2",
        "--set",
        "train.tensorboard=false",
        "-o",
        str(out),
    ]
    # Bytes: text mode would turn the progress bar's carriage returns into line ends.
    proc = subprocess.run(cmd, capture_output=True, timeout=150)
    stdout, stderr = (s.decode(errors="replace") for s in (proc.stdout, proc.stderr))
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]

    # Every accuracy printed by any task on either stream is on its scale.
    printed = [float(v) for s in (stdout, stderr) for v in _ANY_ACCURACY.findall(s)]
    assert len(printed) >= 6, stdout[-3000:]  # 2 epochs: accuracy, then accuracy and val_
    assert all(0.0 <= v <= 1.0 for v in printed), sorted(printed)[-5:]

    epochs = _epochs(stdout)
    assert len(epochs) == 2, stdout[-3000:]
    for updates in epochs:
        # The one call's per-step update, then the epoch's end.
        assert [(u["step"], u["total"], u["eta"]) for u in updates] == [
            (STEPS, STEPS, True),
            (STEPS, STEPS, False),
        ], updates
        for u in updates:
            for key in ("accuracy", "val_accuracy"):
                if key in u:
                    assert 0.0 <= float(u[key]) <= 1.0, f"{key} {u[key]} off scale in {u}"

    run = json.loads((out / "run.json").read_text())
    history = json.loads((out / "metrics.json").read_text())
    assert [r["epoch"] for r in history] == [1, 2]
    assert run["history"] == history
    assert run["train"]["steps_per_epoch"] == run["train"]["steps_per_execution"] == STEPS
    for row in history:
        assert 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["val_accuracy"] <= 1.0, row
    assert 0.0 <= run["metrics"]["test_accuracy"] <= 1.0, run["metrics"]
    assert run["strategy"]["num_replicas"] == 2 and run["strategy"]["num_workers"] == 2
    # A reduction gone wrong scales the figures: without this check a model still under 50%
    # accuracy would show half-true figures inside [0, 1].
    assert history[0]["accuracy"] > 0.5, history

    # Each epoch's per-step update covers the whole epoch: the figures recorded for it, as the
    # progress bar rounds them (and so does the epoch-end line).
    for updates, row in zip(epochs, history):
        for key in ("accuracy", "loss"):
            want = _keras_format(row[key])
            assert [u[key] for u in updates] == [want, want], (key, updates, row)
