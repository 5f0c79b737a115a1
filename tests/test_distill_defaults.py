"""The distillation defaults pay: ``python -m tfopt.distill --teacher RUN --student tiny_cnn`` with no
other flag gives a better student than ``python -m tfopt.train --model tiny_cnn`` at the same seed
and budget, on the validation split of a seeded MNIST slice.

The full-size evidence is ``bench/distill_defaults.py`` (the selection on validation and the
check on test, ``bench/results/distill_defaults.json``); this is its CI-sized replica: the
``mnist_run`` teacher (the default ``cnn``, 2 epochs on 10k images), students on the first 5,000
training images for 2 epochs (the same budget on both sides), one_device.

Margin: the per-seed gain must exceed MARGIN_PT. Measured with these exact settings (seeds 42,
43, 44; validation accuracy): the defaults gained +11.9, +11.2, +11.0 pt over ``tfopt.train``'s
defaults (a range of 0.8 pt), the former defaults (T=4, alpha=0.9, lr 1e-3, no augmentation)
-3.2, -5.7, -2.2 pt; a 5 pt margin sits ~8 ranges below the one and far above the other, so a
regression to defaults that do not pay fails here. At the same recipe (``tfopt.train`` with the
defaults' learning rate and shifts) the teacher's share on this slice was +2.2, +0.7, -0.7 pt:
too noisy at CI size to assert, see bench/results/distill_defaults.json for the full-size check.
"""

import json
import os

import pytest

from tfopt.distill.cli import main as distill
from tfopt.train.cli import main as train

COMMON = [
    "--limit",
    "5000",
    "--epochs",
    "2",
    "--strategy",
    "one_device",
    "--quiet",
    "--set",
    "data.num_shards=4",
    "--set",
    "train.tensorboard=false",
]
SEEDS = (42, 43)
MARGIN_PT = (
    5.0  # per seed: distill defaults - tfopt.train defaults (validation accuracy, pt); see above
)


def _val(out) -> float:
    with open(os.path.join(out, "run.json"), encoding="utf-8") as f:
        return json.load(f)["history"][-1]["val_accuracy"]


def distilled(tmp_path, teacher: str, seed: int, flags=()) -> float:
    """Validation accuracy of the student from ``python -m tfopt.distill`` (defaults plus ``flags``)."""
    out = tmp_path / f"distill-{seed}-{len(flags)}"
    assert (
        distill(
            [
                "--teacher",
                teacher,
                "--student",
                "tiny_cnn",
                "--seed",
                str(seed),
                *flags,
                *COMMON,
                "-o",
                str(out),
            ]
        )
        == 0
    )
    return _val(out)


def trained(tmp_path, seed: int, flags=()) -> float:
    """Validation accuracy of the student from ``python -m tfopt.train --model tiny_cnn`` (plus ``flags``)."""
    out = tmp_path / f"train-{seed}-{len(flags)}"
    assert (
        train(
            [
                "--model",
                "tiny_cnn",
                "--set",
                f"train.seed={seed}",
                "--set",
                f"data.seed={seed}",
                *flags,
                *COMMON,
                "-o",
                str(out),
            ]
        )
        == 0
    )
    return _val(out)


@pytest.mark.slow
def test_distill_defaults_beat_training_the_student_alone(tmp_path, mnist_run):
    for seed in SEEDS:
        d, alone = distilled(tmp_path, mnist_run, seed), trained(tmp_path, seed)
        assert 100 * (d - alone) > MARGIN_PT, (seed, d, alone)
