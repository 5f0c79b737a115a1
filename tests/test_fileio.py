"""Atomic artifact writes: contents, atomicity, and the permissions the user's umask gives.

Artifacts must be readable by TensorBoard or a serving process running as another user: a file
written by tfopt gets 0666 minus the umask (0644 under 022, 0640 under 027) and a directory 0777
minus the umask, exactly what ``open()`` / ``mkdir`` give, never mkstemp's private 0600/0700.
"""

import json
import os
import shutil
import stat
import tempfile

import numpy as np
import pytest

from tfopt.core.fileio import atomic_dir, atomic_path, write_bytes, write_json, write_text

UMASKS = (0o022, 0o027)


@pytest.fixture(params=UMASKS, ids=lambda m: f"umask{m:03o}")
def umask(request):
    """Runs the test under a given umask and restores the previous one."""
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _no_debris(directory) -> None:
    assert not [p for p in os.listdir(directory) if p.startswith((".tmp-", ".old-"))]


def test_write_bytes_text_json_honour_the_umask(umask, tmp_path):
    write_bytes(str(tmp_path / "model.tflite"), b"TFL3")
    write_text(str(tmp_path / "export.md"), "# x\n")
    write_json(str(tmp_path / "sub" / "run.json"), {"epoch": np.int64(3), "w": np.arange(2)})
    for name in ("model.tflite", "export.md", "sub/run.json"):
        assert _mode(tmp_path / name) == 0o666 & ~umask, name
    assert json.loads((tmp_path / "sub" / "run.json").read_text()) == {"epoch": 3, "w": [0, 1]}
    # Replacing an existing private file gives the artifact the umask's mode too.
    (tmp_path / "old.bin").write_bytes(b"old")
    os.chmod(tmp_path / "old.bin", 0o600)
    write_bytes(str(tmp_path / "old.bin"), b"new")
    assert (tmp_path / "old.bin").read_bytes() == b"new" and _mode(
        tmp_path / "old.bin"
    ) == 0o666 & ~umask
    _no_debris(tmp_path)


def test_atomic_path_honours_the_umask_whatever_the_writer_does(umask, tmp_path):
    with atomic_path(str(tmp_path / "model.keras")) as tmp:
        assert tmp.endswith(".keras") and not os.path.exists(tmp)  # the writer creates it
        with open(tmp, "wb") as f:
            f.write(b"plain")
    assert _mode(tmp_path / "model.keras") == 0o666 & ~umask
    # A writer that copies a private scratch file (shutil.copy keeps its 0600) still yields a readable artifact.
    fd, scratch = tempfile.mkstemp(dir=tmp_path)
    os.close(fd)
    with atomic_path(str(tmp_path / "copied.bin")) as tmp:
        shutil.copy(scratch, tmp)
    assert _mode(tmp_path / "copied.bin") == 0o666 & ~umask
    os.unlink(scratch)
    # On an exception nothing is left behind and the target is untouched.
    with pytest.raises(RuntimeError):
        with atomic_path(str(tmp_path / "model.keras")) as tmp:
            open(tmp, "wb").close()
            raise RuntimeError("writer failed")
    assert (tmp_path / "model.keras").read_bytes() == b"plain"
    _no_debris(tmp_path)


def test_atomic_dir_honours_the_umask_and_replaces_atomically(umask, tmp_path):
    target = tmp_path / "runs" / "mnist"
    for round_ in (1, 2):  # the second round replaces an existing directory
        with atomic_dir(str(target)) as tmp:
            assert _mode(tmp) == 0o777 & ~umask
            write_json(os.path.join(tmp, "run.json"), {"round": round_})
            os.mkdir(os.path.join(tmp, "tensorboard"))
        assert _mode(target) == 0o777 & ~umask
        assert _mode(target / "run.json") == 0o666 & ~umask
        assert _mode(target / "tensorboard") == 0o777 & ~umask
        assert json.loads((target / "run.json").read_text()) == {"round": round_}
    with pytest.raises(RuntimeError):
        with atomic_dir(str(target)) as tmp:
            write_json(os.path.join(tmp, "run.json"), {"round": 3})
            raise RuntimeError("stage failed")
    assert json.loads((target / "run.json").read_text()) == {"round": 2}
    _no_debris(target.parent)


def test_save_model_artifacts_honour_the_umask(umask, tmp_path):
    from tfopt.core._keras import keras

    from tfopt.models.io import save_model

    inputs = keras.Input((4,))
    paths = save_model(keras.Model(inputs, keras.layers.Dense(2)(inputs)), str(tmp_path / "run"))
    assert _mode(paths["keras"]) == 0o666 & ~umask
    assert _mode(paths["saved_model"]) == 0o777 & ~umask
    for root, dirs, files in os.walk(paths["saved_model"]):
        for d in dirs:
            assert _mode(os.path.join(root, d)) == 0o777 & ~umask, d
        for f in files:
            assert _mode(os.path.join(root, f)) == 0o666 & ~umask, f
    _no_debris(tmp_path / "run")
