"""Hiding what native libraries print on fd 2, around the calls that print it, never losing a crash.

TensorFlow, the TFLite converter and the LiteRT interpreter write to file descriptor 2 directly,
below Python: start-up notices (no CUDA driver here, the XNNPACK delegate is on, the quantizer's
settings) and the converter's MLIR diagnostics, which its exception repeats anyway. Two blocks
hide them, each used only around a call known to print them:

- ``filtered()``: lines matching ``NOISE`` are dropped; every other line is forwarded at once.
- ``quiet()``: lines are held back and dropped when the block ends, normally or by an exception
  (the converter: ``explain_error`` turns its exception into one line). If the process dies
  inside the block (a native abort, a kill), the held lines are printed.

For the block, fd 2 becomes a pipe read by a small child process (this file run as a script,
standard library only) that writes to the real stderr. A thread would die with the process and
lose the last lines of a native abort; a child reads the pipe to its end. Blocks nest; they are
not meant for several threads at once (fd 2 is process-wide). ``TF_CPP_MIN_LOG_LEVEL=0`` (the
user wants TensorFlow's own logs) turns both off.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator

# Start-up notices, not messages for the user: CUDA probing on a machine without a GPU, absl's
# note before its logging starts, LiteRT's default XNNPACK delegate, the quantizer's settings.
NOISE = re.compile(rb"XNNPACK delegate for CPU|cuInit|cuda_|fully_quantize: \d|absl::InitializeLog")
_WAIT_S = 10.0  # for the child to forward what is left; it only ever waits on the pipe


def _enabled() -> bool:
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2") not in (
        "",
        "0",
    )  # tfopt._keras defaults it to 2


def _marker(token: str) -> bytes:
    return f"\x1btfopt-native-stderr-end-{token}".encode()


@contextlib.contextmanager
def _through_child(mode: str) -> Iterator[None]:
    if not _enabled():
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
        # The child inherits the real fd 2; its own session keeps a Ctrl-C from killing it first:
        # it ends when the pipe closes, after forwarding everything.
        child = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), mode, token],
            stdin=r,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:  # cannot start the filter: leave fd 2 alone
        for fd in (r, w, saved):
            os.close(fd)
        yield
        return
    os.close(r)
    sys.stderr.flush()
    os.dup2(w, 2)
    os.close(w)
    try:
        yield
    finally:
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


def quiet() -> contextlib.AbstractContextManager:
    """Hides what native code prints inside the block, unless the process dies in it (then prints it)."""
    return _through_child("quiet")


def _serve(mode: str, token: str) -> None:
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
        if NOISE.search(line):
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
    _serve(sys.argv[1], sys.argv[2])
