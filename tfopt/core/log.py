"""tfopt's logging: a logger per module under ``tfopt``; the command lines decide where it goes.

A configured command prints ``<program>: <message>`` lines on stderr (``tfopt train: resuming at
step 40 ...``); a stage run inside another command (a pipeline's teacher) names itself with
``extra={"prog": "tfopt train"}``. The one line a training process ends with (``done {json}``,
read by launchers and scripts) goes to stdout through the ``tfopt.result`` logger, at every
verbosity. Used as a library (a notebook), tfopt adds no handler: Python's logging settings apply,
and ``configure("tfopt")`` shows the lines as the commands do.
"""

from __future__ import annotations

import logging
import sys

#: Progress lines (``[1/2] int8: converting``): shown by default, hidden by ``--quiet``. Events
#: (resuming from a backup, a rollback, a choice made) are INFO: ``--quiet`` keeps them.
PROGRESS = 15
logging.addLevelName(PROGRESS, "PROGRESS")
#: Verbosity levels of :func:`configure`: ``--quiet``, the default, ``--verbose``.
QUIET, NORMAL, VERBOSE = logging.INFO, PROGRESS, logging.DEBUG
RESULT = "tfopt.result"


class _Stream(logging.StreamHandler):
    """Writes to ``sys.stderr`` / ``sys.stdout`` as they are at each line (pytest and IPython swap them)."""

    def __init__(self, name: str):
        self._which = name
        super().__init__()

    @property
    def stream(self):
        return getattr(sys, self._which)

    @stream.setter
    def stream(self, _value) -> None:
        pass


class _Prefixed(logging.Formatter):
    def __init__(self, prog: str):
        super().__init__()
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        text = f"{getattr(record, 'prog', self.prog)}: {level}{record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure(prog: str, level: int = NORMAL) -> None:
    """Sends tfopt's log lines to stderr, prefixed by ``prog``, and its result lines to stdout.

    Args:
        prog: The program name lines start with when they do not name their own (``tfopt train``).
        level: ``QUIET`` (events, warnings, errors), ``NORMAL`` (progress too) or ``VERBOSE``
            (debug lines too).
    """
    for name, stream, lvl in (("tfopt", "stderr", level), (RESULT, "stdout", logging.INFO)):
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if isinstance(h, _Stream)]:
            logger.removeHandler(handler)
        handler = _Stream(stream)
        handler.setFormatter(_Prefixed(prog))
        logger.addHandler(handler)
        logger.setLevel(lvl)
        logger.propagate = False
    # TensorFlow's and absl's Python warnings ("Using CollectiveAllReduceStrategy eagerly has
    # significant overhead", tf.function retracing notices) speak of TensorFlow's internals, not of
    # anything the user did: shown with --verbose only. Their errors still print.
    # A level the user's own code set (e.g. INFO to see the strategies' lines) is kept.
    for name in ("tensorflow", "absl"):
        logger = logging.getLogger(name)
        if logger.level in (logging.NOTSET, logging.DEBUG, logging.WARNING, logging.ERROR):
            logger.setLevel(logging.DEBUG if level <= VERBOSE else logging.ERROR)
