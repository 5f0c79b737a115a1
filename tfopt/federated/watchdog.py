"""What a federated run's Flower processes leave behind, found and stopped; and the watchdog that
does it the moment the run's chief dies.

The SuperLink and the SuperNodes die with the chief (their parent-death signal), but the
ServerApp the SuperLink starts is not tfopt's child: with its SuperLink killed under it, it can
hang on in its shutdown. Every Flower process of a run carries the run's own ``FLWR_HOME`` in
its environment, which is how they are found. ``python -m tfopt.federated.watchdog PID HOME``
(started by :class:`tfopt.federated.flower.Flower`, in a session of its own and without
TensorFlow) waits for process ``PID`` to end and then stops every process carrying
``FLWR_HOME=HOME``: a run killed and never started again leaves nothing running.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import time

log = logging.getLogger(__name__)


def carrying(home: str) -> list[int]:
    """The processes (other than this one) whose environment holds ``FLWR_HOME=home``.

    Args:
        home: A run's ``FLWR_HOME``.
    """
    needle = b"\0" + f"FLWR_HOME={home}".encode() + b"\0"
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else ()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in b"\0" + f.read() + b"\0" and int(pid) != os.getpid():
                    found.append(int(pid))
        except OSError:  # gone, or not ours
            continue
    return found


def stop_leftovers(home: str) -> list[int]:
    """Kills (SIGKILL) every process carrying ``FLWR_HOME=home``; returns their ids.

    Args:
        home: A run's ``FLWR_HOME`` (the run directory's lock keeps any other process of the
            run away).
    """
    pids = carrying(home)
    for pid in pids:
        log.info("stopping process %s, left by an earlier attempt of this run", pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def wait_for_exit(pid: int) -> None:
    """Returns once process ``pid`` has ended (a pidfd where the kernel has them: no polling,
    no confusion with a later process given the same id)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfd_open (kernel < 5.3): poll
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            except PermissionError:  # alive, not ours to signal
                pass
            time.sleep(0.5)
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    """``python -m tfopt.federated.watchdog PID HOME``: waits for ``PID``, then stops what
    carries ``FLWR_HOME=HOME``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[0].isdigit():
        raise SystemExit("usage: python -m tfopt.federated.watchdog PID FLWR_HOME")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the run, not us
    wait_for_exit(int(args[0]))
    stop_leftovers(args[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
