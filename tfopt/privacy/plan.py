"""A DP-SGD run's plan: the noise, the sampling rate and what the run will spend, fixed before
the first step (a budget the planned steps would exceed refuses the run in one line)."""

from __future__ import annotations

from dataclasses import dataclass

from tfopt.config.privacy import PrivacyConfig
from tfopt.core.errors import ConfigError
from tfopt.privacy import accountant

#: How the record describes the two ways of per-example norms (tfopt.privacy.ghost, .dpsgd).
PER_EXAMPLE = {
    "ghost": "each example's gradient norm from the layer's input and output gradient (one "
    "backward pass), then one backward pass of the clip-weighted loss",
    "vectorized": "each example's gradient mapped over the batch (tf.vectorized_map)",
}
#: Strategies whose steps are the steps the accountant counts (one synchronous batch each).
SYNCHRONOUS = ("one_device", "mirrored", "multi_worker_mirrored")


@dataclass(frozen=True)
class Plan:
    """What a DP-SGD run does and spends.

    Attributes:
        l2_clip: The clipping norm C.
        noise_multiplier: sigma (given, or computed for the budget).
        delta: The delta every epsilon is at.
        examples: N, the training examples.
        batch: The global batch size.
        steps: The planned optimizer steps.
        budget: The epsilon the run may spend (0 = none given).
    """

    l2_clip: float
    noise_multiplier: float
    delta: float
    examples: int
    batch: int
    steps: int
    budget: float

    @property
    def q(self) -> float:
        """The sampling rate, batch over N."""
        return self.batch / self.examples

    def spent(self, steps: int) -> dict[str, float]:
        """``{"rdp": epsilon, "pld": epsilon}`` after ``steps`` steps."""
        return accountant.epsilon(self.noise_multiplier, self.q, steps, self.delta)

    def section(self, steps: int, layers: dict | None = None) -> dict:
        """The ``train.privacy`` record of a run that took ``steps`` steps (``layers``: each
        trainable layer -> how its per-example norms were computed)."""
        eps = self.spent(steps)
        return {
            "mechanism": "DP-SGD (per-example clipping, Gaussian noise)",
            "l2_clip": self.l2_clip,
            "noise_multiplier": self.noise_multiplier,
            "noise_stddev": self.noise_multiplier * self.l2_clip,
            "delta": self.delta,
            "examples": self.examples,
            "batch": self.batch,
            "sampling_rate": self.q,
            "steps": steps,
            "epsilon": eps["rdp"],
            "epsilon_rdp": eps["rdp"],
            "epsilon_pld": eps["pld"],
            "budget": self.budget or None,
            "sampling": accountant.SAMPLING,
            "per_example_gradients": {"methods": PER_EXAMPLE, "layers": layers or {}},
        }


def make_plan(
    p: PrivacyConfig,
    *,
    examples: int,
    batch: int,
    steps_per_epoch: int,
    epochs: int,
    strategy: str,
) -> Plan:
    """Fixes a run's noise and checks its budget before it trains.

    Args:
        p: The privacy settings (enabled).
        examples: N, the training examples.
        batch: The global batch size.
        steps_per_epoch: Optimizer steps per epoch.
        epochs: Epochs the run trains.
        strategy: The run's strategy.

    Raises:
        ConfigError: one line: an asynchronous strategy, a delta at or above 1/N, a budget the
            planned steps exceed at the given noise, or one no noise reaches.
    """
    if strategy not in SYNCHRONOUS:
        raise ConfigError(
            f"DP-SGD under --strategy {strategy}: asynchronous steps are not the batches the "
            f"accountant counts; use one of {', '.join(SYNCHRONOUS)}"
        )
    delta = p.delta or accountant.default_delta(examples)
    if delta >= 1 / examples:
        raise ConfigError(
            f"--dp-delta {delta:g} is not below 1/N = {1 / examples:.3g} (N = {examples} training "
            "examples): a delta that large allows releasing some examples outright; give a smaller "
            "--dp-delta, or 0 for the default"
        )
    steps, q = steps_per_epoch * epochs, batch / examples
    noise = p.noise or accountant.noise_for(p.epsilon, q, steps, delta)
    if p.noise and p.epsilon:
        allowed = accountant.steps_within(noise, q, delta, p.epsilon, steps)
        if allowed < steps:
            spent = accountant.epsilon(noise, q, steps, delta)["rdp"]
            raise ConfigError(
                f"--dp-epsilon {p.epsilon:g} at --dp-noise {noise:g}: the {epochs} epochs "
                f"({steps} steps) would spend {spent:.3g}; the budget allows "
                f"{allowed // steps_per_epoch} epochs ({allowed} steps): give --epochs "
                f"{max(1, allowed // steps_per_epoch)}, more --dp-noise, or no --dp-noise to have "
                "it computed for the budget"
            )
    return Plan(p.l2_clip, noise, delta, examples, batch, steps, p.epsilon)
