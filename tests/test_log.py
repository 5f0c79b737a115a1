"""tfopt's logging as the command lines configure it: prefixes, levels, stdout for results."""

import logging

import pytest

from tfopt.config import cli
from tfopt.core import log


def _lines(capsys):
    captured = capsys.readouterr()
    return captured.out.splitlines(), captured.err.splitlines()


def _say_everything():
    logger = logging.getLogger("tfopt.export.runner")
    logger.debug("a detail")
    logger.log(log.PROGRESS, "[1/2] int8: converting")
    logger.info("resuming at step 40", extra={"prog": "tfopt train"})
    logger.warning("the servers listen on every interface")
    logging.getLogger(log.RESULT).info('done {"task": "local"}', extra={"prog": "tfopt train"})


@pytest.mark.parametrize(
    "flags, shown",
    [
        ([], ["progress", "event", "warning"]),
        (["--quiet"], ["event", "warning"]),
        (["--verbose"], ["debug", "progress", "event", "warning"]),
        (["--quiet", "--verbose"], ["event", "warning"]),
    ],
)
def test_levels_prefixes_and_the_result_line(capsys, flags, shown):
    import argparse

    parser = argparse.ArgumentParser()
    cli.add_verbosity(parser, "no progress lines")
    log.configure("tfopt export", cli.verbosity(parser.parse_args(flags)))
    _say_everything()
    out, err = _lines(capsys)
    every = {
        "debug": "tfopt export: a detail",
        "progress": "tfopt export: [1/2] int8: converting",
        "event": "tfopt train: resuming at step 40",
        "warning": "tfopt export: warning: the servers listen on every interface",
    }
    assert err == [every[k] for k in shown]
    # The result line goes to stdout at every verbosity, for launchers and scripts.
    assert out == ['tfopt train: done {"task": "local"}']


def test_configuring_again_replaces_the_handlers(capsys):
    log.configure("tfopt report")
    log.configure("tfopt pipeline")
    logging.getLogger("tfopt.report.builder").info("reading run")
    assert _lines(capsys) == ([], ["tfopt pipeline: reading run"])


def test_unconfigured_tfopt_leaves_its_lines_to_python_logging(caplog, capsys):
    with caplog.at_level(log.PROGRESS, logger="tfopt"):
        logging.getLogger("tfopt.report.builder").log(log.PROGRESS, "drawing the figures")
    assert [r.getMessage() for r in caplog.records] == ["drawing the figures"]
    assert _lines(capsys) == ([], [])  # no handler of tfopt's own


@pytest.mark.parametrize("level, shown", [(log.NORMAL, False), (log.VERBOSE, True)])
def test_tensorflow_python_warnings_are_shown_with_verbose_only(level, shown):
    from tfopt.core._keras import tf

    log.configure("tfopt train", level)
    for logger in (tf.get_logger(), logging.getLogger("absl")):
        assert logger.isEnabledFor(logging.WARNING) is shown, logger.name
        assert logger.isEnabledFor(logging.ERROR)  # their errors always print
