"""Progress lines show metrics on their true scale under a real 2-worker MultiWorkerMirroredStrategy.

tf_keras sums a step's metric results over the workers by default ("auto" reduction), though every
replica's results are already all-reduced: the per-step progress figures came out twice the real
ones (``accuracy: 1.97``) while the epoch-end figures and the history were right.
"""

import json
import re
import subprocess
import sys

import pytest
from isolation import ISOLATED

# One progress-bar update: "32/39 [====>...] - ETA: 0s - loss: 0.9381 - accuracy: 0.6895" (a
# per-step update) or "39/39 [====] - 4s 102ms/step - loss: ... - val_accuracy: ..." (the epoch's
# end). An epoch's updates share one line, each after a carriage return (and backspaces); Keras
# prints every value with 4 decimals (%.4f, or %.4e below 1e-3).
_VALUE = r"-?\d+\.\d{4}(?:e[+-]\d+)?|nan|-?inf"
_UPDATE = re.compile(
    r"(?P<step>\d+)/(?P<total>\d+) \[[=>.]+\] - (?P<time>ETA: \S+|\d+\w*(?: \d+\w+/step)?)"
    rf"(?P<metrics>(?: - \w+: (?:{_VALUE}))*)"
)
_METRIC = re.compile(rf"(\w+): ({_VALUE})")


def _epochs(stdout: str) -> list[list[dict]]:
    """The chief's progress updates, one list per epoch: {"step", "total", "eta", metric: value}."""
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
            update.update({k: float(v) for k, v in _METRIC.findall(m["metrics"])})
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
        "--epochs",
        "2",
        "--set",
        "train.tensorboard=false",
        "-o",
        str(out),
    ]
    # Bytes: text mode would turn the progress bar's carriage returns into line ends.
    proc = subprocess.run(cmd, capture_output=True, timeout=150)
    stdout = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, stdout[-3000:] + proc.stderr.decode(errors="replace")[-3000:]

    epochs = _epochs(stdout)
    assert len(epochs) == 2, stdout[-3000:]
    for updates in epochs:
        # Per-step updates (steps_per_execution 32 of 39 steps) and the epoch-end line.
        assert any(u["eta"] for u in updates), updates
        assert not updates[-1]["eta"] and updates[-1]["step"] == updates[-1]["total"], updates
    for updates in epochs:
        for u in updates:
            for key in ("accuracy", "val_accuracy"):
                if key in u:
                    assert 0.0 <= u[key] <= 1.0, f"{key} {u[key]} off scale in {u}"

    run = json.loads((out / "run.json").read_text())
    history = json.loads((out / "metrics.json").read_text())
    assert [r["epoch"] for r in history] == [1, 2]
    assert run["history"] == history
    for row in history:
        assert 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["val_accuracy"] <= 1.0, row
    assert run["strategy"]["num_replicas"] == 2 and run["strategy"]["num_workers"] == 2
    # A reduction gone wrong scales the figures: without this check a model still under 50%
    # accuracy would show half-true figures inside [0, 1].
    assert history[0]["accuracy"] > 0.5, history

    # The last per-step update of an epoch covers the whole epoch: the same figures as recorded.
    last_step = [u for u in epochs[-1] if u["eta"]][-1]
    assert last_step["step"] == last_step["total"], epochs[-1]
    recorded = history[-1]
    for key in ("accuracy", "loss"):
        assert last_step[key] == pytest.approx(recorded[key], abs=2e-4), (key, last_step, recorded)
        assert epochs[-1][-1][key] == pytest.approx(recorded[key], abs=2e-4), (key, recorded)
