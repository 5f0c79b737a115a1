"""Every command says what it made: train's start line, phase lines and summary before its JSON
line; export's .tflite paths and the one ``ship:`` line, whose file is copied to model.tflite."""

import json
import os
import re

import pytest
from image_folder import split_digits_folder


@pytest.mark.slow
def test_train_and_export_say_where_they_wrote_and_what_to_ship(tmp_path, capsys):
    from tfopt.export.cli import main as export_main
    from tfopt.train.cli import main as train_main

    images = split_digits_folder(str(tmp_path / "imgs"), counts=(30, 6, 12), classes=3)
    run = tmp_path / "run"
    data = ["--dataset", f"folder:{images}", "--image-size", "32x32", "--channels", "3"]
    argv = [*data, "--epochs", "2", "--batch-size", "16", "--strategy", "one_device"]
    assert train_main([*argv, "-o", str(run)]) == 0
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.startswith("tfopt train: ")]
    expected = [
        rf"writing {re.escape(str(run))}: folder:.* \(90 train, 18 validation, 36 test; 3 classes, "
        r"32x32x3\), one_device on 1 replica\(s\), global batch 16, float32; the model gets "
        r"pixels / 255 \(input scale unit, decided by default\)",
        r"evaluating on the test split \(36 examples\)",
        r"saving the model \(\.keras and SavedModel\)",
        rf"test accuracy \d+\.\d%; wrote {re.escape(str(run))} .*next: python -m tfopt\.export "
        rf"--from {re.escape(str(run))}$",
    ]
    assert len(lines) == len(expected), lines
    for line, pattern in zip(lines, expected):
        assert re.fullmatch(f"tfopt train: {pattern}", line), (line, pattern)
    assert out.strip().splitlines()[-1].startswith("tfopt train: done {")  # the JSON line last

    exported = tmp_path / "export"
    argv = ["--from", str(run), "--modes", "float32,int8", "-o", str(exported)]
    small = ["--runs", "5", "--warmup", "1", "--threads", "1", "--no-keras-latency"]
    code = export_main([*argv, *small, "--min-agreement", "0", "--max-accuracy-drop", "100"])
    out, err = capsys.readouterr()
    assert code == 0, err
    record = json.loads((exported / "run.json").read_text())["export"]
    wrote = [ln for ln in out.splitlines() if ln.startswith("tfopt export: wrote ")]
    files = [os.path.join(str(exported), r["file"]) for r in record["modes"]]
    assert wrote[: len(files)] == [f"tfopt export: wrote {f}" for f in files]
    ship = record["ship"]
    (line,) = [ln for ln in out.splitlines() if ln.startswith("ship: ")]
    assert line.startswith(f"ship: {exported / 'model.tflite'} ({ship['mode']}, ")
    assert (exported / "model.tflite").read_bytes() == (exported / ship["from"]).read_bytes()
    # the shipped file is the fastest at one thread among those that passed
    p50 = {r["file"]: r["latency"]["xnnpack/1t"]["p50_ms"] for r in record["modes"]}
    assert ship["from"] == min(p50, key=p50.get)
    table = [ln for ln in out.splitlines() if ln.startswith("|")]
    assert len(table) == 4 and max(map(len, table)) <= 100, table  # the table fits 100 columns
