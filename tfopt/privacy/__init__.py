"""tfopt.privacy: differentially private training (DP-SGD) and what it spends.

:mod:`~tfopt.privacy.accountant` computes epsilon with Google's ``dp-accounting`` (RDP and PLD),
:mod:`~tfopt.privacy.plan` fixes a run's noise and budget before it trains, and
:mod:`~tfopt.privacy.dpsgd` clips each example's gradient and adds the noise in a tf_keras
model's train step. The ``train`` stage uses them (``--dp-l2-clip``, ``--dp-noise``,
``--dp-epsilon``, ``--dp-delta``; docs/privacy.md). Names load on first use (PEP 562).
"""

from tfopt.core.lazy import exports

_EXPORTS = {
    "Plan": "tfopt.privacy.plan",
    "make_plan": "tfopt.privacy.plan",
    "epsilon": "tfopt.privacy.accountant",
    "noise_for": "tfopt.privacy.accountant",
    "default_delta": "tfopt.privacy.accountant",
    "make_private": "tfopt.privacy.dpsgd",
    "clipped_noisy_mean": "tfopt.privacy.dpsgd",
    "EpsilonLog": "tfopt.privacy.dpsgd",
}

__all__, __getattr__ = exports(__name__, _EXPORTS)
