"""The ``privacy`` section: DP-SGD's settings (see docs/privacy.md)."""

from __future__ import annotations

from dataclasses import dataclass

from tfopt.config.fields import flag
from tfopt.core.errors import ConfigError


@dataclass(frozen=True)
class PrivacyConfig:
    """Differentially private training (DP-SGD): on when ``l2_clip`` > 0."""

    l2_clip: float = flag(
        0.0,
        "--dp-l2-clip",
        "DP-SGD: clip each example's gradient to this L2 norm, add Gaussian noise (0 = off)",
        metavar="C",
    )
    noise: float = flag(
        0.0,
        "--dp-noise",
        "DP-SGD noise multiplier: the noise's std over --dp-l2-clip (0 = computed from "
        "--dp-epsilon)",
        metavar="SIGMA",
    )
    epsilon: float = flag(
        0.0,
        "--dp-epsilon",
        "DP-SGD budget: the run spends at most this epsilon (RDP accountant); without --dp-noise "
        "the noise is computed for it",
        metavar="EPS",
    )
    delta: float = flag(
        0.0,
        "--dp-delta",
        "DP-SGD delta (0 = the largest power of ten below 1/N, N the training examples)",
        metavar="DELTA",
    )

    @property
    def enabled(self) -> bool:
        """Whether the run trains with DP-SGD."""
        return self.l2_clip > 0


#: Each field's option.
FLAGS = {
    "l2_clip": "--dp-l2-clip",
    "noise": "--dp-noise",
    "epsilon": "--dp-epsilon",
    "delta": "--dp-delta",
}


def check_privacy(p: PrivacyConfig) -> None:
    """The settings alone in range (those that need the data's size are checked by the plan).

    Raises:
        ConfigError: one line naming the value and the fix.
    """
    for key, option in FLAGS.items():
        value = getattr(p, key)
        if not value >= 0:
            raise ConfigError(
                f"privacy.{key}={value} must be >= 0 ({option}); 0 = "
                + ("off" if key == "l2_clip" else "default")
            )
    if not p.enabled and (p.noise or p.epsilon or p.delta):
        raise ConfigError(
            "--dp-noise, --dp-epsilon and --dp-delta set DP-SGD, which clips each example's "
            "gradient: give --dp-l2-clip C too (e.g. 1.0)"
        )
    if p.enabled and not (p.noise or p.epsilon):
        raise ConfigError(
            f"--dp-l2-clip {p.l2_clip:g} without --dp-noise or --dp-epsilon: give the noise "
            "multiplier, or the epsilon to compute it for"
        )
    if p.delta >= 1:
        raise ConfigError(f"--dp-delta {p.delta:g} must be below 1 (and below 1/N)")
