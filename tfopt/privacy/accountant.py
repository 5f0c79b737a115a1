"""What DP-SGD spends: epsilon at a delta, from Google's ``dp-accounting``.

DP-SGD's privacy cost is that of the sampled Gaussian mechanism composed over the training
steps: each step samples a batch with rate ``q = batch / N`` and adds Gaussian noise of
``noise_multiplier`` times the clipping norm to the summed clipped gradients. Two accountants
bound it: Renyi DP (RDP; the one TensorFlow Privacy's tables quote) and privacy loss
distributions (PLD; tighter). tfopt reports both and holds a budget to the RDP figure, the
larger: no run spends more than it says.

The data pipeline shuffles and cuts fixed-size batches; the accountants assume Poisson
sampling at rate q, as TensorFlow Privacy's tutorials do. The record says so
(:data:`SAMPLING`).
"""

from __future__ import annotations

import logging
import math

from tfopt.core.errors import ConfigError

#: How the record describes the sampling the epsilon assumes.
SAMPLING = (
    "shuffled fixed-size batches; epsilon computed as for Poisson sampling at rate batch/N "
    "(as TensorFlow Privacy's tutorials do)"
)
#: The largest noise multiplier a target epsilon may ask for before tfopt calls it out of reach.
MAX_NOISE = 1000.0
#: Below this noise multiplier the PLD accountant's discretized privacy loss outgrows memory (and
#: the epsilon is past any use): only RDP is reported.
PLD_LEAST_NOISE = 0.5


def _dp():
    try:
        import dp_accounting
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise ConfigError(
            "DP-SGD needs the dp-accounting package: pip install 'dp-accounting>=0.6,<0.7'"
        ) from e
    return dp_accounting


def _event(noise_multiplier: float, q: float, steps: int):
    dp = _dp()
    return dp.SelfComposedDpEvent(
        dp.PoissonSampledDpEvent(q, dp.GaussianDpEvent(noise_multiplier)), steps
    )


def epsilon(noise_multiplier: float, q: float, steps: int, delta: float) -> dict[str, float]:
    """The epsilon ``steps`` DP-SGD steps spend at ``delta``, by each accountant.

    Args:
        noise_multiplier: The noise's standard deviation over the clipping norm.
        q: The sampling rate, batch size over the number of training examples.
        steps: Optimizer steps taken.
        delta: The delta of (epsilon, delta)-DP.

    Returns:
        ``{"rdp": epsilon, "pld": epsilon}`` (0.0 for no step; PLD None below
        :data:`PLD_LEAST_NOISE`).
    """
    if steps <= 0:
        return {"rdp": 0.0, "pld": 0.0}
    out = {"rdp": _rdp(noise_multiplier, q, steps, delta), "pld": None}
    if noise_multiplier >= PLD_LEAST_NOISE:
        from dp_accounting import pld

        accountant = pld.PLDAccountant()
        accountant.compose(_event(noise_multiplier, q, steps))
        out["pld"] = float(accountant.get_epsilon(delta))
    return out


def _rdp(noise_multiplier: float, q: float, steps: int, delta: float) -> float:
    from dp_accounting import rdp

    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)  # RDP drops the orders it cannot compute, warning for each
    try:
        accountant = rdp.RdpAccountant()
        accountant.compose(_event(noise_multiplier, q, steps))
        return float(accountant.get_epsilon(delta))
    finally:
        absl.setLevel(level)


def noise_for(target: float, q: float, steps: int, delta: float) -> float:
    """The least noise multiplier at which ``steps`` steps spend at most ``target`` epsilon
    (RDP accountant), to 3 significant digits rounded up.

    Raises:
        ConfigError: the target needs more noise than :data:`MAX_NOISE`.
    """

    def spent(noise: float) -> float:
        return _rdp(noise, q, steps, delta)

    low, high = 0.1, 1.0
    while spent(high) > target:
        low, high = high, high * 2
        if high > MAX_NOISE:
            raise ConfigError(
                f"--dp-epsilon {target:g} needs a noise multiplier above {MAX_NOISE:g} for "
                f"{steps} steps at sampling rate {q:.3g}: no model learns under that noise; give "
                "a larger --dp-epsilon, fewer --epochs or a smaller --batch-size"
            )
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (low, mid) if spent(mid) <= target else (mid, high)
    digits = 2 - math.floor(math.log10(high))
    rounded = math.ceil(high * 10**digits) / 10**digits
    return rounded if spent(rounded) <= target else high


def steps_within(noise_multiplier: float, q: float, delta: float, budget: float, most: int) -> int:
    """The most steps (up to ``most``) whose RDP epsilon stays within ``budget``."""

    def spent(steps: int) -> float:
        return _rdp(noise_multiplier, q, steps, delta)

    if spent(most) <= budget:
        return most
    low, high = 0, most  # spent(low) <= budget < spent(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if spent(mid) <= budget else (low, mid)
    return low


def default_delta(n: int) -> float:
    """The delta a run of ``n`` training examples defaults to: the largest power of ten below
    ``1 / n`` (1e-5 for MNIST's 60,000, as TensorFlow Privacy's tutorial uses)."""
    return 10.0 ** math.floor(math.log10(1.0 / n) - 1e-12)
