"""TensorFlow's native start-up notices (the CUDA probe on a machine without a GPU, absl's note,
oneDNN, cuDNN factories) never reach a user's terminal unless --verbose; a real GPU failure does."""

import os
import re
import subprocess
import sys

import pytest

from tfopt.core import native_stderr

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What TensorFlow 2.21 prints on a CPU machine, and what older versions printed.
CUINIT = (
    b"E0000 00:00:1795901144.338952    3431 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    b"CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n"
)
OLD_CUINIT = (
    b"2023-05-01 12:00:00.123456: E tensorflow/compiler/xla/stream_executor/cuda/cuda_driver.cc:268]"
    b" failed call to cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected\n"
)
CUDART = (
    b"I0000 00:00:1795901138.994789    3427 cudart_stub.cc:31] Could not find cuda drivers on your "
    b"machine, GPU will not be used.\n"
)
ALWAYS = [
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
    b"I0000 00:00:1795901137.465879    3427 port.cc:153] oneDNN custom operations are on. You may "
    b"see slightly different numerical results\n",
    b"I0000 00:00:1795901137.510302    3427 cpu_feature_guard.cc:227] This TensorFlow binary is "
    b"optimized to use available CPU instructions in performance-critical operations.\n",
    b"To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with "
    b"the appropriate compiler flags.\n",
    b"E0000 00:00:1700000000.000000    1234 cuda_dnn.cc:8310] Unable to register cuDNN factory: "
    b"Attempting to register factory for plugin cuDNN when one has already been registered\n",
    b"E0000 00:00:1700000000.000000    1234 cuda_blas.cc:1418] Unable to register cuBLAS factory: "
    b"Attempting to register factory for plugin cuBLAS when one has already been registered\n",
    b"W0000 00:00:1700000000.000000    1234 computation_placer.cc:177] computation placer already "
    b"registered. Please check linkage and avoid linking the same target more than once.\n",
    b"2024-01-01 00:00:00.000000: W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] TF-TRT "
    b"Warning: Could not find TensorRT\n",
    b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n",
]
REAL = [
    b"F0000 00:00:1700000000.000000    1234 cuda_platform.cc:52] Check failed: cuInit\n",  # fatal
    b"E0000 00:00:1700000000.000000    1234 cuda_dnn.cc:522] Could not create cudnn handle: "
    b"CUDNN_STATUS_INTERNAL_ERROR\n",
    b"W0000 tfopt-test: a native warning at interpreter creation\n",
    b"tfopt train: error: the GPU failed: failed call to cuInit\n",  # not a native log line
    b'  File "/x/cuda_platform.py", line 52, in probe\n',
]


@pytest.mark.parametrize("gpu", [False, True])
def test_start_up_notices_are_noise_on_every_machine_and_real_lines_never(gpu):
    assert [ln for ln in ALWAYS if not native_stderr.is_noise(ln, gpu)] == []
    assert [ln for ln in REAL if native_stderr.is_noise(ln, gpu)] == []


def test_the_cuda_probe_failing_is_noise_only_without_a_gpu():
    for line in (CUINIT, OLD_CUINIT, CUDART):
        assert native_stderr.is_noise(line, gpu=False), line
        assert not native_stderr.is_noise(line, gpu=True), line  # a real GPU failure: shown


def test_a_gpu_is_an_nvidia_device_node_or_the_loaded_driver(tmp_path):
    dev, driver = tmp_path / "dev", tmp_path / "driver-nvidia"
    dev.mkdir()
    (dev / "null").touch()
    assert not native_stderr.gpu_present(str(dev), str(driver))
    assert not native_stderr.gpu_present(str(tmp_path / "no-dev"), str(driver))
    for node in ("nvidia0", "nvidiactl", "dxg", "nvhost-ctrl-gpu"):
        (dev / node).touch()
        assert native_stderr.gpu_present(str(dev), str(driver)), node
        (dev / node).unlink()
    driver.mkdir()
    assert native_stderr.gpu_present(str(dev), str(driver))


# A process printing the CUDA probe's failure and a real line in a filtered block, the device
# check injected, at the verbosity given.
_FILTERED = r"""
import os, sys
from tfopt.core import log, native_stderr

native_stderr.gpu_present = lambda: sys.argv[1] == "gpu"
log.configure("tfopt test", log.VERBOSE if sys.argv[2] == "verbose" else log.QUIET)
with native_stderr.filtered():
    os.write(2, CUINIT)
    os.write(2, b"W0000 tfopt-test: a real line\n")
"""


def _filtered(gpu: str, verbosity: str) -> list[str]:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as a user runs it
    proc = subprocess.run(
        [sys.executable, "-c", f"CUINIT = {CUINIT!r}\n{_FILTERED}", gpu, verbosity],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return proc.stderr.decode().splitlines()


def test_the_filter_drops_the_cuda_probe_failing_only_without_a_gpu_and_not_with_verbose():
    real, cuinit = "W0000 tfopt-test: a real line", CUINIT.decode().rstrip("\n")
    assert _filtered("no-gpu", "quiet") == [real]
    assert _filtered("gpu", "quiet") == [cuinit, real]
    assert _filtered("no-gpu", "verbose") == [cuinit, real]


# Any of the lines TensorFlow prints when it starts on a machine without a GPU.
_NOTICE = re.compile(
    r"cuInit|cudart_stub|cpu_feature_guard|absl::InitializeLog|Unable to register cu\w+ factory"
    r"|computation_placer|TF-TRT|oneDNN custom operations"
)


@pytest.mark.slow
@pytest.mark.skipif(native_stderr.gpu_present(), reason="a GPU is here: cuInit does not fail")
@pytest.mark.parametrize("flag", ["--quiet", "--verbose"])
def test_training_on_a_cpu_machine_prints_tensorflows_start_up_notices_only_with_verbose(
    flag, tmp_path
):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as a user runs it
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfopt.train",
            *("--dataset", "digits", "--limit", "64", "--batch-size", "32"),
            *("--epochs", "1", "--steps-per-epoch", "1", "--strategy", "one_device"),
            *("-o", str(tmp_path / "run"), flag),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tfopt train: done " in proc.stdout
    notices = [ln for ln in proc.stderr.splitlines() if _NOTICE.search(ln)]
    if flag == "--quiet":
        assert notices == [], proc.stderr
    else:  # the CUDA probe's failure (listing devices, after the import) and the import's notices
        assert any("failed call to cuInit" in ln for ln in notices), proc.stderr
        assert any("absl::InitializeLog" in ln for ln in notices), proc.stderr
