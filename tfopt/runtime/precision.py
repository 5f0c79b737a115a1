"""The global Keras mixed-precision policy, chosen by one string.

Rules that model code must follow under a mixed policy:

* The last layer (the logits, or the softmax) must be created with ``dtype="float32"``:
  a float16/bfloat16 softmax or loss loses precision and can overflow.
* ``mixed_float16`` is meant for GPUs (Tensor Cores). It needs loss scaling against gradient
  underflow; tf_keras ``Model.compile`` wraps the optimizer in a ``LossScaleOptimizer``
  automatically under this policy, so custom training loops must do it themselves.
  On CPUs float16 math is slow.
* ``mixed_bfloat16`` needs no loss scaling (bfloat16 has float32's exponent range) and pays on
  CPUs with AVX512_BF16 / AMX and on TPUs, for models large enough that the math dominates.

Variables stay float32 under both mixed policies; only the computation is cast.

``auto`` is not a Keras policy: the Job resolves it to the faster of the candidates measured on
this machine (:mod:`tfopt.runtime.autoprecision`) before anything calls :func:`set_policy`.
An explicit ``mixed_bfloat16`` on a machine without bf16 hardware gets a one-line warning
(:func:`bf16_warning`): there TensorFlow emulates bfloat16 math, which is slower than float32.
"""

from __future__ import annotations

import logging

from tfopt.core._keras import keras, tf

from tfopt.core.cpu import cpu_flags
from tfopt.core.specs import AUTO_PRECISION, PRECISIONS

log = logging.getLogger(__name__)

# /proc/cpuinfo flags of the CPUs that compute in bfloat16 natively: AVX512_BF16 (Intel Cooper
# Lake and later, AMD Zen 4 and later) and AMX (Intel Sapphire Rapids and later).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
_warned: set[str] = set()


def set_policy(name: str) -> None:
    """Sets the global Keras (tf_keras) dtype policy.

    Call it before building the model: layers read the policy when they are created.

    Args:
        name: A name in :data:`tfopt.core.specs.PRECISIONS`.

    Raises:
        ConfigError: ``name`` is not one of these.
        ValueError: ``name`` is ``auto``, which the Job resolves to a policy first.
    """
    PRECISIONS.get(name)
    if name == AUTO_PRECISION:
        raise ValueError(
            "precision 'auto' is not a Keras policy; the Job resolves it before the model is built"
        )
    keras.mixed_precision.set_global_policy(name)


def policy_name() -> str:
    """Returns the name of the current global Keras dtype policy (e.g. ``"float32"``)."""
    return keras.mixed_precision.global_policy().name


def accelerators() -> list[str]:
    """The device types of this process that compute in 16-bit natively (``GPU``, ``TPU``), if any."""
    return [kind for kind in ("GPU", "TPU") if tf.config.list_physical_devices(kind)]


def bf16_warning(policy: str, flags: set[str], devices: list[str]) -> str | None:
    """The warning for ``policy`` on this hardware, or None when there is nothing to say.

    Args:
        policy: The requested policy name.
        flags: The CPU's feature flags (:func:`tfopt.core.cpu.cpu_flags`).
        devices: The accelerator types present (:func:`accelerators`).

    Returns:
        One line for ``mixed_bfloat16`` on a CPU without AVX512_BF16 or AMX and without a GPU
        or TPU (TensorFlow then emulates bfloat16 math, slower than float32); None otherwise.
    """
    if policy != "mixed_bfloat16" or devices or flags & set(BF16_CPU_FLAGS):
        return None
    return (
        "mixed_bfloat16 on a CPU without bf16 hardware (no avx512_bf16 or amx_bf16 flag, no GPU or "
        "TPU) likely trains slower than float32; use --precision auto to measure both, or float32"
    )


def warn_without_bf16_hardware(policy: str, prog: str) -> None:
    """Logs :func:`bf16_warning` for this machine, once per process."""
    message = bf16_warning(policy, cpu_flags(), accelerators())
    if message and message not in _warned:
        _warned.add(message)
        log.warning(message, extra={"prog": prog})
