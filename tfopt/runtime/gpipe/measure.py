"""What a GPipe split costs, measured on the devices it runs on.

* **Stage time:** each stage's forward and backward passes of the M micro-batches, alone, in one
  call as in the step (median of a few runs after a warm-up): its busy time ``b_k`` in a step;
  and the whole pipelined step's forward and backward passes, ``T``.
* **Idle fraction (the bubble):** ``1 - sum(b_k) / (K * T)``: the share of the K devices'
  time in a step that no micro-batch's work fills; GPipe's formula
  ``(K-1)/(M+K-1)`` is what it comes to when every stage takes the same time on a device of its
  own. Logical CPU devices share the cores and a stage measured alone uses all of them: there
  the step takes about the stages' summed time and the figure comes near ``1 - 1/K``.
* **Peak memory:** the whole pipelined step's peak under its schedule (``gpipe`` or ``1f1b``);
  each stage's peak allocation while it holds the activations of all M
  micro-batches for their backward pass, with and without rematerialization, beside the unsplit
  model's on the whole batch (the allocator's peak, ``tf.config.experimental.get_memory_info``;
  logical CPU devices share one allocator, so the stages are measured one after another; on a
  CPU, oneDNN's allocator serves allocations under 256 KiB from a pool it does not count, so a
  small model's small micro-batches can measure 0).

:func:`measure` runs after training, on the trained stages: its forward passes run in training
mode (BatchNormalization statistics move), and nothing is saved after it. :func:`check_budget`
runs before training (``--device-memory-mib``) and puts the weights back.
"""

from __future__ import annotations

from typing import Any

from tfopt.core._keras import tf

from tfopt.core.errors import ConfigError
from tfopt.runtime.gpipe.cost import median_seconds, stage_step
from tfopt.runtime.gpipe.model import Pipelined
from tfopt.runtime.gpipe.schedule import microbatch_sizes

ArrayLike = Any  # a NumPy array or a tensor


def _peak_bytes(device: str, fn) -> int:
    """The allocator's peak on ``device`` while ``fn`` runs, above what was allocated before."""
    fn()  # traces (and allocates its constants) first
    tf.config.experimental.reset_memory_stats(device)
    before = tf.config.experimental.get_memory_info(device)["current"]
    tf.nest.map_structure(lambda t: t.numpy(), fn())
    return int(tf.config.experimental.get_memory_info(device)["peak"] - before)


def _stage_inputs(pipelined: Pipelined, x) -> list[list]:
    """Each stage's inputs on the batch ``x``: the previous stage's outputs, micro-batch by
    micro-batch (inference mode: nothing moves)."""
    m = min(pipelined.microbatches, int(x.shape[0]))
    parts = tf.split(x, microbatch_sizes(tf.shape(x)[0], m), num=m)
    inputs = []
    for stage, device in zip(pipelined.stages, pipelined.devices, strict=True):
        inputs.append(parts)
        with tf.device(device):
            parts = [stage(h, training=False) for h in parts]
    return inputs


def stage_peaks(pipelined: Pipelined, x: ArrayLike) -> list[int]:
    """Each stage's peak bytes on its device in a training step on the batch ``x``, under the
    model's schedule and rematerialization: its weights, plus the allocator's peak while it runs
    the forward and backward passes of the micro-batches it holds at once (all M under GPipe,
    K-k under 1F1B). The model's weights are put back afterwards (training-mode passes move
    BatchNormalization statistics).

    Args:
        pipelined: The split model.
        x: One batch of inputs at the training batch size.
    """
    x = tf.convert_to_tensor(x)
    k = len(pipelined.stages)
    saved = pipelined.get_weights()
    peaks = []
    for i, (stage, device, held) in enumerate(
        zip(pipelined.stages, pipelined.devices, _stage_inputs(pipelined, x), strict=True)
    ):
        if pipelined.schedule == "1f1b":
            held = held[: k - i]
        weights = sum(v.shape.num_elements() * v.dtype.size for v in stage.variables)
        with tf.device(device):
            step = stage_step(stage, pipelined.remat)
            peaks.append(weights + _peak_bytes(device, lambda s=step, h=held: s(h)))
    pipelined.set_weights(saved)
    return peaks


def check_budget(pipelined: Pipelined, x: ArrayLike, mib: float) -> list[int]:
    """:func:`stage_peaks`, refusing a split whose costliest stage would not fit ``mib`` MiB.

    Returns:
        Each stage's peak bytes.

    Raises:
        ConfigError: a stage's peak is over the budget (the message names the stage and the
            ways to make it smaller).
    """
    peaks = stage_peaks(pipelined, x)
    worst = max(range(len(peaks)), key=peaks.__getitem__)
    if peaks[worst] > mib * 2**20:
        span = ""
        if pipelined.partition:
            names = pipelined.partition.stages[worst]
            span = f" ({names[0]})" if len(names) == 1 else f" ({names[0]}..{names[-1]})"
        raise ConfigError(
            f"--device-memory-mib {mib:g}: stage {worst + 1} of {len(peaks)}{span} needs "
            f"{peaks[worst] / 2**20:.1f} MiB in a step of {int(x.shape[0])} examples in "
            f"{pipelined.microbatches} micro-batches; give more --stages, --remat, "
            "--pipeline-schedule 1f1b or a smaller --batch-size"
        )
    return peaks


def measure(pipelined: Pipelined, x: ArrayLike, y: ArrayLike, repeats: int = 5) -> dict:
    """Times and peak memory of ``pipelined``'s stages on the batch ``x``, ``y``.

    Args:
        pipelined: The split model, compiled (its loss is the training loss).
        x: One batch of inputs (its size is the training batch).
        y: Its labels.
        repeats: Timed runs per figure (the median is kept).

    Returns:
        ``stage_seconds`` (each stage's busy time: its forward and backward passes of the M
        micro-batches), ``step_seconds``,
        ``bubble_measured``, ``bubble_formula``, ``stage_peak_bytes`` and
        ``stage_peak_bytes_remat`` (M micro-batches held), ``step_peak_bytes`` (the whole
        pipelined step under the model's schedule) and
        ``unsplit_peak_bytes``.
    """
    x, y = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
    k, m = len(pipelined.stages), min(pipelined.microbatches, int(x.shape[0]))
    stage_seconds, peaks, peaks_remat = [], [], []
    for stage, device, held in zip(
        pipelined.stages, pipelined.devices, _stage_inputs(pipelined, x), strict=True
    ):
        with tf.device(device):
            plain, recomputed = stage_step(stage, False), stage_step(stage, True)
            stage_seconds.append(median_seconds(lambda s=plain, h=held: s(h), repeats))
            peaks.append(_peak_bytes(device, lambda s=plain, h=held: s(h)))
            peaks_remat.append(_peak_bytes(device, lambda s=recomputed, h=held: s(h)))

    @tf.function
    def pipelined_step():
        return pipelined.gradients(x, y)[1]

    @tf.function
    def unsplit_step():
        with tf.GradientTape() as tape:
            value = pipelined.compute_loss(x, y, pipelined(x, training=True))
        return tape.gradient(value, pipelined.trainable_variables)

    step = median_seconds(pipelined_step, repeats)
    return {
        "batch": int(x.shape[0]),
        "repeats": repeats,
        "stage_seconds": stage_seconds,
        "step_seconds": step,
        "bubble_measured": 1.0 - sum(stage_seconds) / (k * step),
        "bubble_formula": (k - 1) / (m + k - 1),
        "stage_peak_bytes": peaks,
        "stage_peak_bytes_remat": peaks_remat,
        "step_peak_bytes": _peak_bytes(pipelined.devices[0], pipelined_step),
        "unsplit_peak_bytes": _peak_bytes(pipelined.devices[0], unsplit_step),
    }
