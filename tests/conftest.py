"""Test set-up: tf_keras, and the one CPU split into 2 logical devices before TF touches it."""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfopt.runtime.devices import setup_cpu_replicas  # noqa: E402

setup_cpu_replicas(2)
