"""A private network namespace for tests that start TensorFlow servers.

TensorFlow gRPC servers listen unauthenticated on all interfaces even when TF_CONFIG names
127.0.0.1, so a test cluster runs under ``unshare -n`` (with its loopback brought up) where
the kernel allows it (root on Linux), else on loopback as it is.
"""

import os
import shutil
import subprocess


def _isolation_prefix() -> list[str]:
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("ip")):
        return []
    probe = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True)
    return (
        ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
        if probe.returncode == 0
        else []
    )


#: Prepend to a command that starts TensorFlow servers.
ISOLATED = _isolation_prefix()


def launch_isolates() -> bool:
    """True when ``tfopt.launch`` runs a loopback cluster in a private network namespace (its default)."""
    from tfopt.core.errors import ConfigError
    from tfopt.launch import isolation_prefix

    try:
        return bool(isolation_prefix())
    except ConfigError:
        return False
