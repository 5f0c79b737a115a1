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
"""
from __future__ import annotations

from tfopt._keras import keras
from tfopt.specs import PRECISIONS


def set_policy(name: str) -> None:
    """Sets the global Keras (tf_keras) dtype policy.

    Call it before building the model: layers read the policy when they are created.

    Args:
        name: A name in :data:`tfopt.specs.PRECISIONS`.

    Raises:
        ConfigError: ``name`` is not one of these.
    """
    PRECISIONS.get(name)
    keras.mixed_precision.set_global_policy(name)


def policy_name() -> str:
    """Returns the name of the current global Keras dtype policy (e.g. ``"float32"``)."""
    return keras.mixed_precision.global_policy().name
