"""DP-SGD in a stage: the plan said before training, the private step made, the record kept.

``train`` and ``distill`` call the same three functions, so a private run of either says, spends
and records the same way (docs/privacy.md); ``optimize`` says what its fine-tuning of a private
run does not cover.
"""

from __future__ import annotations

import logging

from tfopt.privacy.dpsgd import EpsilonLog, make_private
from tfopt.privacy.plan import Plan, make_plan

log = logging.getLogger(__name__)


def plan_for(job, cfg, steps: int) -> Plan | None:
    """The run's DP-SGD plan (None without ``--dp-l2-clip``), said on the chief.

    Args:
        job: The stage's :class:`~tfopt.runtime.job.Job` (its data, its ``say``).
        cfg: The run's config (``privacy``, ``data``, ``train``, ``runtime``).
        steps: Optimizer steps per epoch.

    Raises:
        ConfigError: the plan's one-line refusals (:func:`~tfopt.privacy.plan.make_plan`).
    """
    if not cfg.privacy.enabled:
        return None
    private = make_plan(
        cfg.privacy,
        examples=job.info.splits["train"].num_records,
        batch=cfg.data.global_batch_size,
        steps_per_epoch=steps,
        epochs=cfg.train.epochs,
        strategy=cfg.runtime.strategy,
    )
    spent = private.spent(private.steps)
    job.say(
        f"DP-SGD: clip {private.l2_clip:g}, noise multiplier {private.noise_multiplier:g}, "
        f"sampling rate {private.q:.3g}, {private.steps} steps: epsilon {spent['rdp']:.3g} (RDP"
        + (f"; PLD {spent['pld']:.3g}" if spent["pld"] is not None else "")
        + f") at delta {private.delta:g}"
    )
    return private


def private_step(model, private: Plan | None, steps: int, done: int, seed: int, norms: dict):
    """Makes the compiled model's step DP-SGD's when the run is private (``norms`` gets how each
    layer's per-example norms are computed); returns the callbacks that log the epsilon spent
    (none otherwise).

    Args:
        model: The compiled model (a classifier, or a Distiller).
        private: The plan, or None.
        steps: Optimizer steps per epoch.
        done: Epochs fitted before this fit.
        seed: Keys the noise.
        norms: Filled with each trainable layer's method.
    """
    if not private:
        return []
    norms.update(
        make_private(model, private.l2_clip, private.noise_multiplier, private.batch, seed)
    )
    return [EpsilonLog(private, steps, first_epoch=done)]


def not_covered(job, source, epochs: int) -> list[str]:
    """The warning (said on the chief, and returned for the record) when a DP-SGD run is
    fine-tuned on data without DP-SGD: the run's budget does not cover that training. A transform
    without training (post-processing) spends nothing and gets none.

    Args:
        job: The fine-tuning stage's Job (its data, whether it is the chief).
        source: The :class:`~tfopt.runs.Run` fine-tuned.
        epochs: The epochs it was fine-tuned (0: no training).
    """
    privacy = (source.record.train or {}).get("privacy")
    if not privacy or not epochs:
        return []
    warning = (
        f"{source.source!r} was trained with DP-SGD (epsilon {privacy['epsilon']:.2f} at delta "
        f"{privacy['delta']:g}); this run fine-tuned it {epochs} epoch(s) on "
        f"{job.cfg.data.dataset} without DP-SGD, which that budget does not cover: the result "
        "is private only if that data needs no privacy (tfopt export's post-training "
        "quantization of the private run spends nothing)"
    )
    if job.chief:
        log.warning(warning, extra={"prog": f"tfopt {job.stage}"})
    return [warning]
