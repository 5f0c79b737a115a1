"""The adversarial corpus: what a hostile or careless user tries, grouped by what it attacks.
Each case failed before its fix; the cases that could lose data compare file contents before and
after, byte for byte."""

import hashlib
import os
import shutil

import pytest

from tfopt.core.errors import ConfigError
from tfopt.runs import RunRecord, refuse_input_as_output
from tfopt.runtime.rundir import RunDir


def tree(path) -> dict:
    """Every file under ``path`` (symlinks not followed) -> sha256 of its bytes."""
    out = {}
    for root, dirs, files in os.walk(path):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, path)
            out[rel] = (
                "link:" + os.readlink(full)
                if os.path.islink(full)
                else hashlib.sha256(open(full, "rb").read()).hexdigest()
            )
    return out


def _finished(path, metrics=None):
    rd = RunDir(str(path), "a", {"x": 1})
    rd.check()
    rd.open()
    with open(os.path.join(rd.work, "model.keras"), "w") as f:
        f.write("the model")
    rd.commit(RunRecord(stage="train", config={}, metrics=metrics or {"run": 1}))
    return path


# -- lost data: the run directory ---------------------------------------------------------------


def test_a_users_dot_old_directory_survives_a_refused_run(tmp_path):
    run = _finished(tmp_path / "runs" / "lossy")
    old = tmp_path / "runs" / "lossy.old"
    shutil.copytree(run, old)
    (old / "n.txt").write_text("notes")
    before = tree(tmp_path / "runs")
    with pytest.raises(ConfigError, match=r"lossy\.old' beside it was left alone"):
        RunDir(str(run), "b", {"x": 2}).check()
    with pytest.raises(ConfigError, match="holds something tfopt did not make"):
        RunDir(str(run), "b", {"x": 2}, overwrite=True).check()
    assert tree(tmp_path / "runs") == before


def test_tfopts_own_dot_old_is_still_cleaned_and_restored(tmp_path):
    run = _finished(tmp_path / "runs" / "r")
    rd = RunDir(str(run), "b", {"x": 2}, overwrite=True)
    rd.check()
    rd.open()
    rd.commit(RunRecord(stage="train", config={}, metrics={"run": 2}))
    assert sorted(os.listdir(tmp_path / "runs")) == ["latest", "r"]
    assert sorted(os.listdir(run)) == ["run.json"]  # no marker, stamp or backup left


def test_a_users_backup_folder_in_a_finished_run_survives_a_refused_stage(tmp_path):
    run = _finished(tmp_path / "runs" / "x")
    (run / "backup").mkdir()
    (run / "backup" / "mine.txt").write_text("my backup")
    before = tree(run)
    with pytest.raises(ConfigError, match="holds a finished run"):
        RunDir(str(run), "b", {"x": 2}).check()
    assert tree(run) == before


def test_a_partial_directory_tfopt_did_not_make_is_refused_not_deleted(tmp_path):
    work = tmp_path / "runs" / "new.partial"
    work.mkdir(parents=True)
    (work / "thesis.tex").write_text("years of work")
    before = tree(work)
    with pytest.raises(ConfigError, match="not a tfopt work directory"):
        RunDir(str(tmp_path / "runs" / "new"), "a", {"x": 1}, overwrite=True).check()
    assert tree(work) == before


# -- lost data: an input given as the output ----------------------------------------------------


def test_an_output_that_holds_the_input_is_refused_however_it_is_spelled(tmp_path):
    run = _finished(tmp_path / "runs" / "x")
    link = tmp_path / "alias"
    link.symlink_to(run)
    for out, source in (
        (run, run),
        (run, run / "model.keras"),
        (f"{tmp_path}/runs/../runs/x", run / "model.keras"),
        (link, run / "model.keras"),
        (tmp_path / "runs", run),
    ):
        with pytest.raises(ConfigError, match="a stage writes a NEW run directory"):
            refuse_input_as_output(str(out), [str(source)])
    refuse_input_as_output(str(tmp_path / "runs" / "x-export"), [str(run / "model.keras")])


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["export", "optimize", "distill"])
def test_a_stage_refuses_to_write_over_the_run_its_model_file_is_in(
    stage, mnist_run, tmp_path, capsys
):
    import importlib

    run = tmp_path / "x"
    shutil.copytree(mnist_run, run)
    before = tree(run)
    model = str(run / "model.keras")
    argv = {
        "export": ["--from", model, "--dataset", "mnist", "--modes", "float32"],
        "optimize": ["--from", model, "--dataset", "mnist", "--technique", "prune"],
        "distill": ["--teacher", model, "--dataset", "mnist", "--student", "tiny_cnn"],
    }[stage]
    main = importlib.import_module(f"tfopt.{stage}.cli").main
    capsys.readouterr()
    code = main([*argv, "-o", str(run), "--overwrite"])
    err = capsys.readouterr().err
    assert code == 2 and "holds the input" in err and "Traceback" not in err, err
    assert tree(run) == before


# -- code run without trust ---------------------------------------------------------------------


def _refused(capsys, command: str, argv: list[str], out) -> str:
    """``python -m tfopt.<command> argv -o out`` in this process: its one error line (exit 2)."""
    import importlib

    main = importlib.import_module(f"tfopt.{command}.cli").main
    capsys.readouterr()
    code = main([*argv, "-o", str(out)])
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith(f"tfopt {command}")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert not os.path.exists(out)
    return lines[0]


def test_a_factory_named_in_a_config_file_is_not_imported_without_trust(
    tmp_path, capsys, monkeypatch
):
    (tmp_path / "evilmod.py").write_text(
        f"open({str(tmp_path / 'ran')!r}, 'w').write('imported')\n"
        "def build(input_shape, num_classes):\n    raise SystemExit('called')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "cfg.yaml"
    config.write_text("model:\n  name: evilmod:build\n")
    line = _refused(capsys, "train", ["--config", str(config)], tmp_path / "out")
    assert "is code" in line and "--trust-model" in line and str(config) in line
    assert not (tmp_path / "ran").exists()  # the module never ran


@pytest.mark.slow
def test_a_factory_named_in_a_runs_record_is_never_imported(
    mnist_run, tmp_path, capsys, monkeypatch
):
    """A later stage starts from the run's model.keras; the factory its run.json names stays unread."""
    import json

    from tfopt.export.cli import main

    (tmp_path / "evilmod.py").write_text(
        f"open({str(tmp_path / 'ran')!r}, 'w').write('imported')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "x"
    shutil.copytree(mnist_run, run)
    record = json.loads((run / "run.json").read_text())
    record["config"]["model"]["name"] = "evilmod:build"
    (run / "run.json").write_text(json.dumps(record))
    argv = ["--from", str(run), "--modes", "float32", "--eval-limit", "64", "--threads", "1"]
    code = main([*argv, "--runs", "3", "--warmup", "1", "--no-plot", "-o", str(tmp_path / "e")])
    assert code == 0, capsys.readouterr().err
    assert not (tmp_path / "ran").exists()  # the module never ran


@pytest.mark.parametrize(
    "model, needle",
    [
        ("os:system", "is builtin_function_or_method"),
        ("builtins:eval", "is builtin_function_or_method"),
        ("json:dumps", "cannot be called so"),
        ("notamodel:build", "returned str ('not a model')"),
    ],
)
def test_a_callable_that_is_no_model_factory_is_one_line(
    model, needle, tmp_path, capsys, monkeypatch
):
    (tmp_path / "notamodel.py").write_text(
        "def build(input_shape, num_classes):\n    return 'not a model'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    data = ["--dataset", "digits", "--strategy", "one_device", "--epochs", "1"]
    line = _refused(capsys, "train", ["--model", model, *data], tmp_path / "out")
    assert needle in line and "build(input_shape, num_classes" in line, line


# -- silent wrong results: class folders --------------------------------------------------------


def _digits(root, classes=3, per_class=4):
    from image_folder import digits_folder

    return digits_folder(str(root), per_class=per_class, classes=classes)


@pytest.mark.parametrize("name", ["line1\nline2", "tab\there", "bell\x07"])
def test_a_class_folder_name_with_a_control_character_is_refused(tmp_path, name):
    from tfopt.config import DataConfig
    from tfopt.core.errors import DataError
    from tfopt.data import prepare

    root = _digits(tmp_path / "imgs")
    os.rename(os.path.join(root, "digit_1"), os.path.join(root, name))
    with pytest.raises(DataError, match="control character") as e:
        prepare(DataConfig(dataset=f"folder:{root}", data_dir=str(tmp_path / "cache")))
    assert "\n" not in str(e.value)


def test_the_folder_digest_sees_images_through_a_symlinked_class_folder(tmp_path):
    import numpy as np
    from image_folder import write_image

    from tfopt.data.folder_source import listing_digest

    outside = tmp_path / "elsewhere"
    _digits(outside)
    root = tmp_path / "imgs"
    root.mkdir()
    for name in ("digit_0", "digit_1"):
        (root / name).symlink_to(outside / name)
    (root / "digit_2").mkdir()
    write_image(str(root / "digit_2" / "a.png"), np.zeros((8, 8, 3), np.uint8))
    before = listing_digest(str(root))
    write_image(str(outside / "digit_0" / "new.png"), np.full((8, 8, 3), 9, np.uint8))
    assert listing_digest(str(root)) != before  # a new image behind the link: new shards


def test_dangling_and_looping_links_are_skipped_with_one_line_each(tmp_path, caplog):
    from tfopt.data.folder_source import listing_digest

    root = tmp_path / "imgs"
    _digits(root)
    (root / "digit_0" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    (root / "digit_1" / "loop.png").symlink_to(root / "digit_1" / "loop.png")
    with caplog.at_level("WARNING", logger="tfopt"):
        listing_digest(str(root))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and any("gone.png" in ln for ln in lines), lines
    assert any("loop.png" in ln for ln in lines), lines


def test_an_image_name_that_is_not_utf8_is_one_line(tmp_path):
    from tfopt.core.errors import DataError
    from tfopt.data.folder_source import listing_digest

    root = tmp_path / "imgs"
    _digits(root)
    bad = os.path.join(os.fsencode(str(root / "digit_0")), b"caf\xe9.png")
    with open(bad, "wb") as f:
        f.write(open(root / "digit_0" / "0000.png", "rb").read())
    with pytest.raises(DataError, match="not a UTF-8 name"):
        listing_digest(str(root))


# -- bounded reads ------------------------------------------------------------------------------


def _bomb(path, member: str, size: int) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open(member, "w", force_zip64=True) as f:
            chunk = b" " * (1 << 20)
            for _ in range(size >> 20):
                f.write(chunk)
        z.writestr("metadata.json", '{"keras_version": "2.15.0"}')


def test_a_model_file_whose_config_expands_past_the_cap_is_one_line(tmp_path, capsys, monkeypatch):
    from tfopt.models import io

    monkeypatch.setattr(io, "MAX_CONFIG_BYTES", 4 << 20)  # the cap's logic, at a size quick to zip
    bomb = tmp_path / "bomb.keras"
    _bomb(bomb, "config.json", 8 << 20)
    assert bomb.stat().st_size < 100_000
    from tfopt.core.errors import ModelError

    with pytest.raises(ModelError, match="config.json expands to 8388608 bytes"):
        io.load_model(str(bomb))
    with pytest.raises(ModelError, match="config.json expands to"):
        io.load_model(str(bomb), trust_model=True)


def test_a_huge_config_file_and_a_huge_value_are_one_readable_line(tmp_path, capsys):
    from tfopt import config as C

    big = tmp_path / "big.yaml"
    big.write_text("model:\n  name: " + "x" * (C.MAX_CONFIG_FILE_BYTES + 10) + "\n")
    with pytest.raises(ConfigError, match="bytes \\(at most"):
        C.load(str(big))
    value = tmp_path / "value.yaml"
    value.write_text("model:\n  name: " + "y" * 500_000 + "\n")
    line = _refused(capsys, "train", ["--config", str(value)], tmp_path / "out")
    assert len(line) <= 2100 and line.endswith("characters, cut)"), line[-200:]


# -- flags and values past what a machine holds -------------------------------------------------


def test_an_image_size_past_8192_a_side_and_a_runaway_model_arg_are_one_line():
    from tfopt.config import parse_image_size
    from tfopt.core.specs import parse_model_args

    with pytest.raises(ConfigError, match="larger than 8192 pixels a side"):
        parse_image_size("100000x100000")
    assert parse_model_args("alpha=" + "-" * 100_000 + "1")["alpha"].endswith("-1")


# -- flags that would be ignored ----------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--image", "foo", "--cpu", "2"], "--image, --cpu apply to --render kubeflow only"),
        (
            ["--render", "kubeflow", "--image", "i", "--max-restarts", "3", "--timeout", "5"],
            "--max-restarts, --timeout apply to a local run",
        ),
        (
            ["--render", "kubeflow", "--image", "i", "--hosts", "2", "--link", "1gbit"],
            "--hosts, --link",
        ),
    ],
)
def test_every_launcher_flag_applies_or_is_refused(argv, needle, capsys):
    from tfopt.launch import main

    assert main([*argv, "--", "python", "-m", "tfopt.train"]) == 2
    out, err = capsys.readouterr()
    assert needle in err and out == "" and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_freeze_epochs_over_every_epoch_of_a_model_from_scratch_warns(tmp_path, capsys):
    from tfopt.train.cli import main

    argv = ["--dataset", "digits", "--strategy", "one_device", "--epochs", "1", "--quiet"]
    assert main([*argv, "--freeze-epochs", "1", "-o", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "--freeze-epochs 1 covers every epoch of 'cnn'" in err and "weights=PATH.h5" in err


# -- OS errors at the edges ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, fix",
    [
        ("ENOSPC", "free space on that disk"),
        ("EROFS", "read-only"),
        ("EACCES", "fix its permissions"),
        ("ENAMETOOLONG", "at most 255 bytes"),
        ("EISDIR", "a directory where a file belongs"),
    ],
)
def test_the_machines_refusals_are_one_line_with_the_fix(code, fix, capsys):
    import errno

    from tfopt.config import cli

    def body():
        raise OSError(
            getattr(errno, code), os.strerror(getattr(errno, code)), "/runs/x/model.keras"
        )

    assert cli.run_main("tfopt export", body) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and fix in err and "'/runs/x/model.keras'" in err


def test_an_os_error_of_ours_keeps_its_traceback():
    import errno

    from tfopt.config import cli

    def body():
        raise OSError(errno.EBADF, "Bad file descriptor")

    with pytest.raises(OSError):
        cli.run_main("tfopt export", body)


def test_a_name_too_long_and_a_directory_as_a_model_file_are_one_line(tmp_path, capsys):
    from tfopt.train.cli import main

    data = ["--dataset", "digits", "--strategy", "one_device", "--epochs", "1", "--quiet"]
    assert main([*data, "-o", str(tmp_path / ("r" * 300))]) == 2
    assert "at most 255 bytes" in capsys.readouterr().err
    (tmp_path / "x.keras").mkdir()
    assert main([*data, "--model", str(tmp_path / "x.keras"), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "x.keras" in err, err


def test_a_folder_of_system_files_is_one_line(tmp_path, capsys):
    data = ["--dataset", "folder:/proc", "--epochs", "1"]
    line = _refused(capsys, "train", data, tmp_path / "out")
    assert "/proc/" in line and "holds no image" in line, line


def _small_disk(tmp_path):
    """A tmpfs of its own (a user and mount namespace): a disk that really fills up."""
    import subprocess

    probe = subprocess.run(["unshare", "-Urm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"this kernel refuses user namespaces: {probe.stderr.decode().strip()}")
    disk = tmp_path / "disk"
    disk.mkdir()
    return disk


@pytest.mark.slow
@pytest.mark.parametrize("full", ["run", "data"])
def test_a_full_disk_is_one_line_and_the_rerun_after_freeing_space_finishes(full, tmp_path):
    """The run directory (its TensorBoard events, model, records) or the shard cache on a disk
    that fills up: one line naming the fix, exit 2; once there is room, the same command
    finishes without --overwrite (no debris in the way)."""
    import subprocess
    import sys

    disk = _small_disk(tmp_path)
    out = disk / "run" if full == "run" else tmp_path / "run"
    data_dir = disk / "data" if full == "data" else tmp_path / "data"
    train = [sys.executable, "-m", "tfopt.train", "--dataset", "digits", "--strategy"]
    train += ["one_device", "--epochs", "1", "--quiet", "-o", str(out), "--data-dir", str(data_dir)]
    command = " ".join(f"'{a}'" for a in train)
    script = (
        f"mount -t tmpfs -o size=48k tmpfs {disk} || exit 99; {command}; echo EXIT=$?; "
        f"mount -o remount,size=64m {disk}; {command}; echo EXIT=$?; ls {out}"
    )
    proc = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    first, second = [ln for ln in proc.stdout.splitlines() if ln.startswith("EXIT=")]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("tfopt train: error:")]
    assert first == "EXIT=2" and len(errors) == 1, proc.stderr
    assert "free space" in errors[0] and "Traceback" not in proc.stderr, proc.stderr
    assert second == "EXIT=0" and "run.json" in proc.stdout, proc.stderr


# -- tampered records ---------------------------------------------------------------------------


def test_a_hand_edited_run_record_is_one_line(tmp_path):
    import json

    from tfopt.runs import RunRecord, load_run

    run = _finished(tmp_path / "runs" / "x")
    raw = json.loads((run / "run.json").read_text())
    raw["metrics"] = {"test_accuracy": "ninety"}
    (run / "run.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="metrics.test_accuracy is 'ninety', not a number"):
        load_run(str(run))
    (run / "run.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a JSON object"):
        load_run(str(run))
    assert RunRecord.from_dict({"stage": "export", "export": {"modes": [{"size_bytes": 12}]}})


def test_tensorflows_full_disk_error_is_one_line_and_its_other_errors_keep_their_traceback(capsys):
    from tfopt.core._keras import tf

    from tfopt.config import cli

    def full():
        raise tf.errors.ResourceExhaustedError(
            None, None, "/data/digits/shards8.tmp/train-00003.tfrecord; No space left on device"
        )

    assert cli.run_main("tfopt train", full) == 2
    err = capsys.readouterr().err
    assert (
        len(err.strip().splitlines()) == 1 and "train-00003.tfrecord" in err and "--data-dir" in err
    )

    def other():
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")

    with pytest.raises(tf.errors.ResourceExhaustedError):
        cli.run_main("tfopt train", other)
