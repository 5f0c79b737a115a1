"""The one place that imports Keras (tf_keras, i.e. Keras 2) and TensorFlow.

tfmot accepts only tf_keras models, and ``tf.keras`` in TF >= 2.16 is Keras 3, so the
legacy flag must be set before TensorFlow is first imported. Every other tfopt module gets
``tf`` and ``keras`` from here.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _import_quietly():
    # TensorFlow's C++ start-up notices (oneDNN, CUDA probing) go to fd 2 before its log level
    # applies; hide them unless the user asked for TF's info logs (TF_CPP_MIN_LOG_LEVEL=0).
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") in ("", "0"):
        import tensorflow
        import tf_keras

        return tensorflow, tf_keras
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow
        import tf_keras

        return tensorflow, tf_keras
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


tf, keras = _import_quietly()

from tfopt.errors import ModelError  # noqa: E402

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
