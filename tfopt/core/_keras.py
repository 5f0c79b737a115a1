"""The one place that imports Keras (tf_keras, i.e. Keras 2) and TensorFlow.

tfmot accepts only tf_keras models, and ``tf.keras`` in TF >= 2.16 is Keras 3, so the
legacy flag must be set before TensorFlow is first imported. Every other tfopt module gets
``tf`` and ``keras`` from here.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfopt.core import native_stderr  # noqa: E402  (standard library only: no TensorFlow)


def _import_quietly():
    # TensorFlow's native start-up notices go to fd 2 whatever TF_CPP_MIN_LOG_LEVEL says (absl
    # logs them before its logging is set up): some at import (oneDNN, CPU instructions, cuDNN
    # factories), the CUDA probe's failure only when devices are first listed. Both happen here, in
    # a block that drops them and forwards any other line (native_stderr's rule; --verbose shows
    # all). On a machine with a GPU the probe is left to its first use: a failure there is real
    # (shown anyway), and CUDA is not initialized before the program has set up its devices.
    with native_stderr.filtered():
        import tensorflow
        import tf_keras

        if not native_stderr.gpu_present():
            tensorflow.config.list_physical_devices()  # the CUDA probe: cuInit fails here
    return tensorflow, tf_keras


tf, keras = _import_quietly()

from tfopt.core.errors import ModelError  # noqa: E402

__all__ = ["tf", "keras", "ensure_tf_keras"]


def ensure_tf_keras(obj, what: str = "model"):
    """Refuses a Keras 3 object with one clear sentence.

    Args:
        obj: A model, layer, optimizer or loss handed to tfopt.
        what: What the object is, for the message.

    Returns:
        ``obj`` unchanged when it is a tf_keras object or not a Keras object at all.

    Raises:
        ModelError: ``obj`` comes from Keras 3 (``keras`` / ``tf.keras`` in TF >= 2.16).
    """
    module = type(obj).__module__ or ""
    if module.split(".")[0] == "keras":
        raise ModelError(
            f"the {what} {type(obj).__name__!r} is a Keras 3 object ({module}); tfopt and tfmot "
            "need Keras 2: build it with `import tf_keras as keras` (or set TF_USE_LEGACY_KERAS=1 "
            "before importing TensorFlow and use tf.keras)"
        )
    return obj
