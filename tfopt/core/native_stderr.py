"""Hiding what native libraries print on fd 2, around the calls that print it, never losing a crash.

TensorFlow, the TFLite converter and the LiteRT interpreter write to file descriptor 2 directly,
below Python: start-up notices (no CUDA driver here, the XNNPACK delegate is on, the quantizer's
settings) and the converter's MLIR diagnostics, which its exception repeats anyway. Most come
from absl's logging before it is initialized, which ``TF_CPP_MIN_LOG_LEVEL`` does not reach. Two
blocks hide them, each used only around a call known to print them (``tfopt.core._keras`` imports
TensorFlow and runs its CUDA probe in one):

- ``filtered()``: lines :func:`is_noise` calls start-up notices are dropped; every other line is
  forwarded at once.
- ``quiet()``: lines are held back and dropped when the block ends, normally or by an exception
  (the converter: ``explain_error`` turns its exception into one line). If the process dies
  inside the block (a native abort, a kill), the held lines are printed.

For the block, fd 2 becomes a pipe read by a small child process (this file run as a script,
standard library only) that writes to the real stderr. A thread would die with the process and
lose the last lines of a native abort; a child reads the pipe to its end. Blocks nest; they are
not meant for several threads at once (fd 2 is process-wide); ``filtered()`` inside an open block
starts no child of its own. Both are off, everything native code
prints showing, when tfopt logs debug lines (a command's ``--verbose``) or when
``TF_CPP_MIN_LOG_LEVEL=0`` (the user wants TensorFlow's own logs).

The CUDA probe's failure (``failed call to cuInit``, ``cudart_stub``: no driver) is a notice only
on a machine without a GPU: it is dropped only when :func:`gpu_present` finds no GPU device node
(``/dev/nvidia*``, WSL's ``/dev/dxg``, Jetson's ``/dev/nvhost-*``) and no
``/proc/driver/nvidia``; on a machine with a GPU it is a real failure (a driver the CUDA libraries
do not match, a device in a bad state) and is shown.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator

# A native log line's start: absl's (``E0000 00:00:1700000000.123456    4242 cuda_platform.cc:52] ``)
# or older TensorFlow's (``2023-01-01 00:00:00.123456: E tensorflow/.../cuda_driver.cc:268] ``),
# up to the source file's name. Never a fatal (F) line: a crash's message always shows.
_NATIVE = rb"^(?:[IWE]\d{4} \S+ +\d+ |\d{4}-\d\d-\d\d [\d:.]+: [IWE] )(?:\S*/)?"
# Start-up notices on every machine: absl's note before its logging starts, oneDNN and CPU
# instruction notices, plugins registered twice, TensorRT not installed (optional), LiteRT's
# default XNNPACK delegate, the quantizer's settings, CompiledModel's start-up.
NOISE = re.compile(
    rb"^WARNING: All log messages before absl::InitializeLog\(\) is called"
    rb"|^To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler"
    rb"|^INFO: Created TensorFlow Lite XNNPACK delegate for CPU"
    rb"|fully_quantize: \d"
    # ai-edge-litert's CompiledModel: its runtime's INFO lines, and the optional NPU / vendor
    # plugins (OpenVINO) that are not installed; the Interpreter's latest-features delegate
    # announcing a flag LiteRT made its default.
    rb"|^INFO: \[[\w./]+\.cc:\d+\] "
    rb"|^WARNING: \[npu_registry\.cc:\d+\] NPU accelerator could not be loaded"
    rb"|^WARNING: \[compiler_plugin\.cc:\d+\] Failed to load plugin at: \S*/vendors/"
    rb"|^(?:\xe2\x94\x94 )?Could not load shared library \S*/vendors/"
    rb"|^ERROR: Subgraph reshaping is enabled by default, TFLITE_XNNPACK_DELEGATE_FLAG_ENABLE_SUBGRAPH"
    + rb"|"
    + _NATIVE
    + rb"(?:port\.cc:\d+\] oneDNN custom operations are on"
    rb"|cpu_feature_guard\.cc:\d+\] "
    rb"|computation_placer\.cc:\d+\] computation placer already registered"
    rb"|\S+:\d+\] Unable to register cu(?:DNN|FFT|BLAS) factory"
    rb"|\S+:\d+\] TF-TRT Warning)"
)
# The CUDA probe failing: a notice only where there is no GPU to probe (see gpu_present).
NO_GPU_NOISE = re.compile(
    _NATIVE + rb"(?:cudart_stub\.cc:\d+\] "
    rb"|cuda_diagnostics\.cc:\d+\] "
    rb"|\S+:\d+\] .*\bcuInit\b"
    rb"|\S+:\d+\] Cannot dlopen some GPU libraries)"
)
_GPU_NODES = ("nvidia", "dxg", "nvhost-")  # /dev/nvidia0, nvidiactl...; WSL2; Jetson
_WAIT_S = 10.0  # for the child to forward what is left; it only ever waits on the pipe
_exit_filter = None  # what filter_until_exit() registered
_depth = 0  # blocks open in this process: filtered() inside one adds nothing but a child's start


def gpu_present(dev: str = "/dev", driver: str = "/proc/driver/nvidia") -> bool:
    """Whether this machine has a GPU CUDA could use: an NVIDIA device node or a loaded driver.

    Args:
        dev: The device directory holding ``nvidia*`` (``dxg`` under WSL2, ``nvhost-*`` on Jetson).
        driver: The NVIDIA kernel driver's proc directory (present whenever it is loaded, in a
            container too).
    """
    if os.path.exists(driver):
        return True
    try:
        return any(name.startswith(_GPU_NODES) for name in os.listdir(dev))
    except OSError:  # no /dev to read: nothing says there is a GPU
        return False


def is_noise(line: bytes, gpu: bool) -> bool:
    """Whether a native line is a start-up notice to drop (the module's rule).

    Args:
        line: One line the native code wrote on fd 2.
        gpu: What :func:`gpu_present` says: with a GPU, the CUDA probe's failure is shown.
    """
    return bool(NOISE.search(line)) or (not gpu and bool(NO_GPU_NOISE.search(line)))


def _enabled() -> bool:
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2") in (
        "",
        "0",
    ):  # tfopt.core._keras defaults it to 2
        return False
    import logging

    # --verbose (or a library user's DEBUG logging) shows everything native code prints.
    return not logging.getLogger("tfopt").isEnabledFor(logging.DEBUG)


def _marker(token: str) -> bytes:
    return f"\x1btfopt-native-stderr-end-{token}".encode()


def _child(mode: str, token: str, pipe: int) -> subprocess.Popen:
    # The child inherits the real fd 2; its own session keeps a Ctrl-C from killing it first:
    # it ends when the pipe closes, after forwarding everything.
    return subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-S",
            os.path.abspath(__file__),
            mode,
            token,
            "gpu" if gpu_present() else "no-gpu",
        ],
        stdin=pipe,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


@contextlib.contextmanager
def _through_child(mode: str) -> Iterator[None]:
    global _depth
    if not _enabled() or (mode == "filter" and _depth):
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 at all: nothing to filter
        yield
        return
    token = secrets.token_hex(8)
    r, w = os.pipe()
    try:
        child = _child(mode, token, r)
    except OSError:  # cannot start the filter: leave fd 2 alone
        for fd in (r, w, saved):
            os.close(fd)
        yield
        return
    os.close(r)
    sys.stderr.flush()
    os.dup2(w, 2)
    os.close(w)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        sys.stderr.flush()
        try:
            os.write(2, _marker(token) + b"\n")  # the block ended with Python in control: no crash
        except OSError:  # the child is gone; its pipe is broken
            pass
        os.dup2(saved, 2)
        os.close(saved)
        try:
            child.wait(
                timeout=_WAIT_S
            )  # forwarded lines come before anything printed after the block
        except (
            subprocess.TimeoutExpired
        ):  # something else still holds the pipe; the child ends with it
            pass


def filtered() -> contextlib.AbstractContextManager:
    """Drops known native start-up notices printed inside the block; forwards every other line at once."""
    return _through_child("filter")


def filter_until_exit() -> None:
    """Filters fd 2 from the moment Python starts to exit until the process ends.

    For native code that prints its notices when it is torn down, after every ``with`` block has
    closed (the LiteRT environments of ai-edge-litert's CompiledModel announce each accelerator
    they destroy). The block opened at exit is never closed: its child forwards every other line
    and ends when the process does.
    """
    global _exit_filter
    if _exit_filter is not None:
        return

    def start() -> None:
        if not _enabled():
            return
        r, w = os.pipe()
        try:
            _child("filter", secrets.token_hex(8), r)
        except OSError:  # cannot start the filter: leave fd 2 alone
            os.close(w)
            return
        finally:
            os.close(r)
        sys.stderr.flush()
        os.dup2(
            w, 2
        )  # never restored: the pipe closes when the process ends, and the child with it
        os.close(w)

    _exit_filter = start
    atexit.register(start)


def quiet() -> contextlib.AbstractContextManager:
    """Hides what native code prints inside the block, unless the process dies in it (then prints it)."""
    return _through_child("quiet")


def _serve(mode: str, token: str, gpu: bool) -> None:
    """The child: reads the pipe on fd 0 until it closes, writes the kept lines to fd 2."""
    done = _marker(token)
    held: list[bytes] = []
    finished = False
    broken = False

    def out(data: bytes) -> None:
        nonlocal broken
        try:
            while data and not broken:
                data = data[os.write(2, data) :]
        except OSError:  # stderr itself is gone: keep draining the pipe so the parent never blocks
            broken = True

    def handle(line: bytes) -> None:
        if is_noise(line, gpu):
            return
        if mode == "quiet":
            held.append(line)
        else:
            out(line)

    pending = b""
    while True:
        chunk = os.read(0, 65536)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if done in line:  # may follow a native line left without its newline
                before = line.split(done, 1)[0]
                if before:
                    handle(before + b"\n")
                finished = True
            else:
                handle(line + b"\n")
    if pending:
        handle(pending)
    if not finished:  # the process died inside the block: what it printed may be all there is
        out(b"".join(held))


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # outlive the parent's Ctrl-C; end at end of input
    _serve(sys.argv[1], sys.argv[2], sys.argv[3] == "gpu")
