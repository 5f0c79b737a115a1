"""``--precision auto``: time each candidate policy on this machine and this model, keep the faster.

:func:`resolve` builds the run's model under each candidate policy (float32, mixed_bfloat16, and
mixed_float16 on a GPU), times training steps of each in turns on the run's own input, and keeps
float32 unless a mixed policy is clearly faster; workers agree through an all-reduce. How it
decides, and what it does not see: docs/training.md, "Precision auto".
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tfopt.core._keras import keras, tf

from tfopt.core import _compat
from tfopt.data import distributed
from tfopt.runtime import precision

MARGIN = 0.05  # a mixed policy must be more than 5% faster than float32 to be chosen
WARMUP_STEPS = 1  # untimed steps per policy: the first call traces the step function
MIN_ROUNDS = 3  # timed steps per policy before ENOUGH_SECONDS can end the probe
MAX_ROUNDS = 30
ENOUGH_SECONDS = 3.0  # timed seconds (all policies) that make a probe long enough
CLEAR_RATIO = 2.0  # after 2 rounds, a policy this much slower than another ends the probe


@dataclass
class Probe:
    """What the probe measured and what it chose (``run.json``: ``strategy.precision_auto``).

    Attributes:
        policy: The chosen policy.
        reason: Why, in a few words.
        examples_per_sec: Per candidate, in the order measured, from the (all-reduced) median
            step time (empty when nothing was measured).
        step_seconds: Per candidate, every timed step's seconds on this process.
        global_batch_size: Examples per step.
        warmup_steps: Untimed steps per candidate.
        seconds: Wall time of the whole probe (building, tracing, warm-up, timed steps).
        workers: Processes whose timings were averaged into the decision.
    """

    policy: str
    reason: str
    examples_per_sec: dict[str, float] = field(default_factory=dict)
    step_seconds: dict[str, list[float]] = field(default_factory=dict)
    global_batch_size: int = 0
    warmup_steps: int = 0
    seconds: float = 0.0
    workers: int = 1

    def to_dict(self) -> dict:
        """A JSON-ready dict (``requested: auto`` first)."""
        return {"requested": "auto", **dataclasses.asdict(self)}

    def log_line(self) -> str:
        """``precision auto: float32 412 ex/s, mixed_bfloat16 301 ex/s -> float32 (reason)``."""
        measured = ", ".join(f"{p} {v:,.0f} ex/s" for p, v in self.examples_per_sec.items())
        return f"precision auto: {measured or 'nothing measured'} -> {self.policy} ({self.reason})"


def candidates(gpu: bool) -> tuple[str, ...]:
    """The policies worth measuring: float32 first, mixed_float16 only where a GPU is present."""
    return ("float32", "mixed_bfloat16") + (("mixed_float16",) if gpu else ())


def choose(examples_per_sec: Mapping[str, float], margin: float = MARGIN) -> tuple[str, str]:
    """The policy to keep, and why.

    Args:
        examples_per_sec: Measured throughput per policy; must include ``float32``.
        margin: How much faster than float32 a mixed policy must be to be kept.

    Returns:
        ``(policy, reason)``: the fastest mixed policy when it beats float32 by more than
        ``margin``, else float32 (ties included).
    """
    base = examples_per_sec["float32"]
    mixed = {p: v for p, v in examples_per_sec.items() if p != "float32"}
    if not mixed:
        return "float32", "no other candidate"
    best = max(mixed, key=lambda p: mixed[p])  # among equals, the first measured
    ratio = mixed[best] / base if base > 0 else float("inf")
    if ratio > 1 + margin:
        return best, f"{best} is {ratio:.2f}x float32"
    return "float32", f"{best} is {ratio:.2f}x float32, not above {1 + margin:.2f}x"


def measure(
    steps: Mapping[str, Callable[[], None]],
    *,
    warmup: int = WARMUP_STEPS,
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int = MAX_ROUNDS,
    enough_seconds: float = ENOUGH_SECONDS,
    clear_ratio: float = CLEAR_RATIO,
    timer: Callable[[], float] = time.perf_counter,
    agree: Callable[[list[float]], list[float]] | None = None,
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Times rounds of one step per policy, after ``warmup`` untimed ones, until the answer is clear.

    The policies take turns and the order rotates every round, so drifting load on a shared
    machine falls on all of them alike. After round k the probe stops when k >= 2 and the slowest
    median step is ``clear_ratio`` x the fastest, or k >= ``min_rounds`` and the timed steps add
    up to ``enough_seconds``, or k == ``max_rounds``.

    Args:
        steps: Policy -> a function running one training step of its model to completion.
        warmup: Untimed steps per policy first.
        min_rounds, max_rounds, enough_seconds, clear_ratio: The stopping rule above.
        timer: Seconds (injectable for tests).
        agree: Averages ``[median per policy..., seconds spent]`` over the processes of a
            multi-worker job (an all-reduce), so that all of them stop after the same round and
            decide from the same numbers; None: this process alone.

    Returns:
        ``(seconds of every timed step per policy on this process, the agreed median per policy)``.
    """
    order = list(steps)
    for _ in range(warmup):
        for p in order:
            steps[p]()
    seconds: dict[str, list[float]] = {p: [] for p in order}
    medians: dict[str, float] = {}
    for k in range(1, max_rounds + 1):
        shift = (k - 1) % len(order)
        for p in order[shift:] + order[:shift]:
            start = timer()
            steps[p]()
            seconds[p].append(timer() - start)
        values = [statistics.median(seconds[p]) for p in order] + [
            sum(sum(v) for v in seconds.values())
        ]
        if agree is not None:
            values = agree(values)
        medians, spent = dict(zip(order, values[:-1])), values[-1]
        clear = k >= 2 and max(medians.values()) >= clear_ratio * min(medians.values())
        if clear or (k >= min_rounds and spent >= enough_seconds):
            break
    return seconds, medians


def decide(
    medians: Mapping[str, float], examples_per_step: int
) -> tuple[str, str, dict[str, float]]:
    """Throughput per policy from its median step time, and the decision of :func:`choose`.

    Returns:
        ``(policy, reason, examples_per_sec)``.
    """
    rates = {
        p: round(examples_per_step / s, 1) if s > 0 else float("inf") for p, s in medians.items()
    }
    policy, reason = choose(rates)
    return policy, reason, rates


def resolve(
    cfg,
    *,
    build: Callable,
    strategy: tf.distribute.Strategy,
    info,
    learning_rate,
    local: bool,
    workers: int,
) -> Probe:
    """Probes the candidate policies for a run and returns the decision.

    Leaves the global policy at float32 and the random generators drawn from: the caller sets the
    chosen policy and seeds again.

    Args:
        cfg: The run's ``RunConfig``.
        build: ``build(model_cfg, image_shape, num_classes) -> keras.Model``, the stage's builder.
        strategy: The run's strategy (entered by the caller), unless ``local``.
        info: The dataset's ``DatasetInfo`` (image shape, classes).
        learning_rate: What the optimizer of each candidate model is given.
        local: Probe on this process's own CPU without the strategy (parameter servers: the
            chief probes alone).
        workers: Processes that agree on the timings through an all-reduce (1: no agreement).

    Raises:
        ConfigError: ``build`` does not know ``cfg.model``'s name (before any step ran).
    """
    started = time.perf_counter()
    policies = candidates(gpu="GPU" in precision.accelerators())
    strategy = tf.distribute.get_strategy() if local else strategy
    data = dataclasses.replace(
        cfg.data, service="", deterministic=cfg.data.deterministic or cfg.runtime.deterministic
    )
    fn = distributed.dataset_fn(data, "train", training=True, info=info)
    dataset = (
        fn(tf.distribute.InputContext())
        if local
        else strategy.distribute_datasets_from_function(fn)
    )
    iterator = iter(dataset)
    models = _candidates(cfg, build, strategy, info, learning_rate, policies)

    def step_of(model) -> Callable[[], None]:
        train_function = model.make_train_function()

        def step() -> None:
            logs = train_function(iterator)  # noqa: F821 (bound above; deleted after use)
            next(iter(logs.values())).numpy()  # waits for the step to finish

        return step

    agree = None if workers == 1 else (lambda values: _mean_over_workers(strategy, values))
    seconds, medians = measure({p: step_of(m) for p, m in models.items()}, agree=agree)
    policy, reason, rates = decide(medians, cfg.data.global_batch_size)
    del models, iterator, dataset
    gc.collect()
    return Probe(
        policy,
        reason,
        rates,
        {p: [round(s, 7) for s in v] for p, v in seconds.items()},
        cfg.data.global_batch_size,
        WARMUP_STEPS,
        round(time.perf_counter() - started, 3),
        workers,
    )


def _candidates(cfg, build: Callable, strategy, info, learning_rate, policies) -> dict:
    """One compiled model per policy, built under ``strategy``; the global policy ends float32."""
    models = {}
    try:
        for policy in policies:
            precision.set_policy(policy)
            with strategy.scope():
                # ConfigError for a name the registry lacks, before any step ran
                model = build(cfg.model, info.image_shape, info.num_classes)
                model.compile(
                    optimizer=keras.optimizers.Adam(learning_rate),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=["accuracy"],
                )
                _compat.build_step_state(model)
            models[policy] = model
    finally:
        precision.set_policy("float32")
    return models


def _mean_over_workers(strategy: tf.distribute.Strategy, values: list[float]) -> list[float]:
    """The element-wise mean of ``values`` over every replica of ``strategy`` (an all-reduce)."""
    per_replica = strategy.run(lambda: tf.constant(values, tf.float32))
    return [
        float(v)
        for v in strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None).numpy()
    ]
