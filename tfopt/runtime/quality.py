"""Is the model worth having? One warning line when a run's held-out accuracy says no.

A run whose test accuracy is at chance (within two binomial standard errors of ``1 / classes``,
at least 2 points), or far below its own validation accuracy, is flagged with its likely cause,
read from what the run did: a BatchNorm network that trained for fewer steps than its moving
averages need to forget their initial values (the statistics used at evaluation are still mostly
the initial mean 0 and variance 1), training accuracy that never left chance (the pixels, the
learning rate, a frozen base, too few steps), or training accuracy that did not carry over to
held-out data. Every stage (train, distill, optimize, export) and the report say it; nothing
is refused: a smoke run at chance is still a run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Initial BatchNorm statistics still weigh this much in the moving averages: too early to evaluate.
_BN_LEFT = 0.05


@dataclass(frozen=True)
class Evidence:
    """What a run did and scored, for :func:`verdict`.

    Attributes:
        test_accuracy: Held-out accuracy of the model the run wrote.
        num_classes: Classes of the data.
        test_examples: Examples ``test_accuracy`` was measured on.
        train_accuracy: The last epoch's training accuracy (None: not trained here).
        val_accuracy: The last epoch's validation accuracy (None: not measured).
        steps: Optimizer steps the run took (0: not trained here).
        bn_momentum: The largest BatchNorm momentum of the model (None: no BatchNorm).
        trainable_share: Share of the weights that trained in the last phase.
        learning_rate: The base learning rate.
        input_read: Whether the pixels the model expects were read from its graph or given by
            the user (False: tfopt fed its default; None: not asked).
    """

    test_accuracy: float
    num_classes: int
    test_examples: int
    train_accuracy: float | None = None
    val_accuracy: float | None = None
    steps: int = 0
    bn_momentum: float | None = None
    trainable_share: float = 1.0
    learning_rate: float | None = None
    input_read: bool | None = None


def chance_margin(num_classes: int, examples: int) -> float:
    """How far above chance an accuracy must be to differ from guessing: two binomial standard
    errors of ``1 / num_classes`` on ``examples``, at least 2 points."""
    p = 1.0 / max(num_classes, 1)
    return max(0.02, 2.0 * math.sqrt(p * (1.0 - p) / max(examples, 1)))


def bn_steps_needed(momentum: float) -> int:
    """Steps after which BatchNorm's initial statistics weigh under 5% in its moving averages."""
    return math.ceil(math.log(_BN_LEFT) / math.log(momentum)) if 0 < momentum < 1 else 0


def verdict(e: Evidence) -> str | None:
    """One line saying the model is not worth having and why, or None when it is.

    Returns:
        ``"test accuracy 8.2% is at chance (10.0% for 10 classes): ..."`` with the likely cause
        and the fix, or None.
    """
    chance = 1.0 / max(e.num_classes, 1)
    at_chance = e.test_accuracy <= chance + chance_margin(e.num_classes, e.test_examples)
    val = e.val_accuracy
    drop = (
        max(0.15, 3.0 * math.sqrt(val * (1.0 - val) / max(e.test_examples, 1)))
        if val is not None
        else None
    )
    below_val = val is not None and e.test_accuracy < val - drop
    if not at_chance and not below_val:
        return None
    if at_chance:
        what = (
            f"test accuracy {e.test_accuracy:.1%} is at chance "
            f"({chance:.1%} for {e.num_classes} classes)"
        )
    else:
        what = f"test accuracy {e.test_accuracy:.1%} is far below validation accuracy {val:.1%}"
    return f"{what}: the model is not worth having; likely {_cause(e, chance)}"


def _cause(e: Evidence, chance: float) -> str:
    learned = e.train_accuracy is not None and e.train_accuracy > chance + 0.15
    if e.input_read is False:
        return (
            "the pixels the model gets: which range it expects was not read from its graph, so "
            "tfopt fed its default (pixels / 255); give --input-scale raw if the model scales "
            "0-255 pixels itself, or --input-scale unit to confirm pixels / 255"
        )
    if e.steps and e.bn_momentum is not None and e.steps < bn_steps_needed(e.bn_momentum):
        return (
            f"{e.steps} training steps are too few for BatchNorm's moving averages (momentum "
            f"{e.bn_momentum:g} needs about {bn_steps_needed(e.bn_momentum)}; training accuracy "
            f"{_pct(e.train_accuracy)}): train longer (more --epochs, a smaller --batch-size)"
        )
    if learned:
        return (
            f"training accuracy {_pct(e.train_accuracy)} did not carry over to held-out data: "
            "check that evaluation gets the pixels training got (--input-scale, data.normalize) "
            "and the model is not memorizing a small training split"
        )
    if e.train_accuracy is None:
        return "the input model was never trained to a useful accuracy: train it first (its run's warnings say why)"
    frozen = (
        f"only {e.trainable_share:.0%} of the weights train (a frozen base: fewer "
        "--freeze-epochs); "
        if e.trainable_share < 0.5
        else ""
    )
    lr = f"{e.learning_rate:g}" if e.learning_rate else "?"
    return (
        f"nothing was learned (training accuracy {_pct(e.train_accuracy)} after {e.steps} steps): "
        f"{frozen}check the pixels the model gets (--input-scale), the learning rate ({lr}: try "
        "10x lower or higher) and train longer"
    )


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.1%}"
