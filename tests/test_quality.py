"""A model not worth having is said so (tfopt.runtime.quality): the verdicts and their causes on the
cases users meet, and a real run at chance against the same run trained properly."""

import json
import subprocess
import sys

import pytest

from tfopt.runtime.quality import Evidence, bn_steps_needed, chance_margin, verdict

# The README's bring-your-own tour before it trained long enough: MobileNetV2 (momentum 0.9 after
# tfopt's change), 12 steps, 42% training accuracy, 7.8% on 600 test images of 10 classes.
TOUR = Evidence(0.078, 10, 600, train_accuracy=0.42, val_accuracy=0.105, steps=12, bn_momentum=0.9)


def test_the_margin_above_chance_is_two_standard_errors():
    assert chance_margin(10, 600) == pytest.approx(2 * (0.1 * 0.9 / 600) ** 0.5)
    assert chance_margin(2, 100_000) == 0.02  # never under 2 points
    assert bn_steps_needed(0.9) == 29 and bn_steps_needed(0.99) == 299  # 0.9**29 < 5% < 0.9**28


def test_too_few_steps_for_batchnorm_is_named_with_the_fix():
    line = verdict(TOUR)
    assert line.startswith("test accuracy 7.8% is at chance (10.0% for 10 classes)")
    assert "12 training steps are too few for BatchNorm's moving averages" in line
    assert "needs about 29" in line and "--epochs" in line and "\n" not in line
    assert (
        verdict(Evidence(0.603, 10, 600, train_accuracy=0.95, steps=190, bn_momentum=0.9)) is None
    )


def test_nothing_learned_names_pixels_learning_rate_and_a_frozen_base():
    line = verdict(Evidence(0.11, 10, 600, train_accuracy=0.1, steps=500, learning_rate=1e-7))
    assert "nothing was learned (training accuracy 10.0% after 500 steps)" in line
    assert "--input-scale" in line and "1e-07" in line and "frozen" not in line
    frozen = verdict(Evidence(0.1, 10, 600, train_accuracy=0.1, steps=500, trainable_share=0.01))
    assert "only 1% of the weights train" in frozen


def test_learned_but_not_carried_over_and_far_below_validation():
    line = verdict(Evidence(0.34, 3, 120, train_accuracy=0.9, val_accuracy=0.85, steps=500))
    assert "at chance" in line and "did not carry over to held-out data" in line
    below = verdict(Evidence(0.6, 10, 1000, train_accuracy=0.95, val_accuracy=0.9, steps=900))
    assert below.startswith("test accuracy 60.0% is far below validation accuracy 90.0%")
    assert verdict(Evidence(0.85, 10, 1000, val_accuracy=0.9)) is None  # within noise


def test_an_untrained_input_is_flagged_by_the_stages_that_only_read_it():
    assert "never trained to a useful accuracy" in verdict(Evidence(0.1, 10, 300))


def _train(tmp_path, name, lr):
    out = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "-m", "tfopt.train", "--dataset", "digits", "--model", "mlp"]
        + ["--epochs", "2", "--batch-size", "32", "--strategy", "one_device", "--lr", lr]
        + ["--data-dir", str(tmp_path / "data"), "-o", str(out), "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(out / "run.json") as f:
        return proc.stderr, json.load(f)


@pytest.mark.slow
def test_a_run_at_chance_says_so_and_the_same_run_trained_does_not(tmp_path):
    err, record = _train(tmp_path, "stuck", "1e-9")
    assert record["metrics"]["test_accuracy"] < 0.2
    (line,) = [l for l in err.splitlines() if "not worth having" in l]
    assert line.startswith("tfopt train: warning: test accuracy") and "nothing was learned" in line
    assert record["warnings"] == [line.split("warning: ", 1)[1]]
    err, record = _train(tmp_path, "trained", "3e-3")
    assert record["metrics"]["test_accuracy"] > 0.8 and record["warnings"] == []
    assert "not worth having" not in err


def test_an_input_scale_tfopt_did_not_read_is_the_first_suspect_at_chance():

    guessed = verdict(Evidence(0.33, 3, 120, input_read=False))
    assert "is at chance" in guessed and "--input-scale raw" in guessed
    assert "not read from its graph" in guessed
    read = verdict(Evidence(0.33, 3, 120, input_read=True))
    assert "is at chance" in read and "not read from its graph" not in read
