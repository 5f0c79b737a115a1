"""tfopt: train TensorFlow models under any tf.distribute strategy and ship them to the edge."""

from tfopt import _moved
from tfopt._version import __version__

_moved.install()

__all__ = ["Distiller", "__version__", "keras", "tf"]


def __getattr__(name):
    # Lazy, so that `import tfopt` (and every CLI's argument check) does not import TensorFlow.
    if name == "Distiller":
        from tfopt.models.distiller import Distiller

        return Distiller
    if name in ("tf", "keras"):  # the TensorFlow tfopt runs on, and tf_keras, the Keras it uses
        from tfopt.core import _keras

        return getattr(_keras, name)
    raise AttributeError(f"module 'tfopt' has no attribute {name!r}")
