"""Logical CPU devices, so `mirrored` runs several replicas on a machine without GPUs."""

from tfopt.core._keras import tf

from tfopt.core.errors import ConfigError


def setup_cpu_replicas(n: int) -> int:
    """Splits the first physical CPU into ``n`` logical devices (no-op with GPUs present).

    Must run before anything initializes TensorFlow's devices. Calling it again with the same
    ``n`` is harmless.

    Args:
        n: Number of logical CPU devices wanted (>= 1).

    Returns:
        The number of logical CPU devices now configured.

    Raises:
        ConfigError: devices were already initialized with a different count.
    """
    if n < 1:
        raise ConfigError(f"cpu_replicas={n} must be >= 1")
    cpus = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(cpus[0])
    if current is not None and len(current) == n:
        return n
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
        )
    except RuntimeError:
        have = len(tf.config.list_logical_devices("CPU"))
        if have != n:
            raise ConfigError(
                f"cpu_replicas={n} cannot be applied: TensorFlow's devices are already initialized "
                f"with {have} CPU device(s); set it before any TensorFlow work"
            ) from None
    return n
