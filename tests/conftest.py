"""Test set-up: tf_keras, a data directory of the tests' own, and the one CPU split into 2 logical
devices before TF touches it."""
import atexit
import os
import shutil
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every session materializes its datasets in a directory of its own (never the user's cache);
# downloads already in the user's cache are read from there (read-only), others fetched again.
_USER_DATA = os.environ.get("TFOPT_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tfopt")
os.environ.setdefault("TFOPT_DOWNLOAD_CACHE", os.path.join(_USER_DATA, "downloads"))
os.environ["TFOPT_DATA_DIR"] = tempfile.mkdtemp(prefix="tfopt-test-data-")
atexit.register(shutil.rmtree, os.environ["TFOPT_DATA_DIR"], True)

from tfopt.runtime.devices import setup_cpu_replicas  # noqa: E402

setup_cpu_replicas(2)

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def mnist_run(tmp_path_factory):
    """A real run directory: the default CNN trained 2 epochs on 10k real MNIST images (one_device).

    Later stages (optimize, distill, export) start from it; treat it as read-only.
    """
    from tfopt import config as C
    from tfopt.train import run as train

    out = tmp_path_factory.mktemp("mnist_run")
    cfg = C.from_dict({
        "data": {"dataset": "mnist", "limit": 10000, "global_batch_size": 64, "num_shards": 4},
        "runtime": {"strategy": "one_device"},
        "train": {"epochs": 2, "output_dir": str(out), "verbose": 0, "tensorboard": False},
    })
    train(cfg)
    return str(out)


def _pipeline(*args, **kw):
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "tfopt.pipeline", "pipelines/mnist_edge.py", "--variant", "smoke",
                             "--set", "train.backup_every=4", "--quiet", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=os.path.dirname(os.path.dirname(__file__)), **kw)


@pytest.fixture(scope="session")
def pipeline_run(tmp_path_factory):
    """The smoke ``mnist_edge`` pipeline, run three times into one run directory.

    1. Stopped by SIGTERM during the student's distillation, right after its first backup.
    2. Run again: the teacher is kept, the student resumes from its backup, the rest runs.
    3. Run again with ``--set export.runs=10``: only the exports rerun; the report is rebuilt.

    Returns ``{"run": path, "codes": [exit codes], "logs": [output of each run]}``.
    """
    import glob
    import signal
    import time

    run = str(tmp_path_factory.mktemp("pipeline") / "mnist_edge")
    codes, logs = [], []
    proc = _pipeline("-o", run)
    lines = []
    backups = os.path.join(run, "student.partial", "backup", "0", "ckpt-*.index")
    deadline = time.time() + 600
    for line in proc.stdout:
        lines.append(line)
        if "student (distill): running" in line:
            break
    while not glob.glob(backups) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    lines += proc.stdout.readlines()
    codes.append(proc.wait())
    logs.append("".join(lines))
    for extra in ((), ("--set", "export.runs=10")):
        proc = _pipeline("-o", run, *extra)
        logs.append(proc.stdout.read())
        codes.append(proc.wait())
    return {"run": run, "codes": codes, "logs": logs}
