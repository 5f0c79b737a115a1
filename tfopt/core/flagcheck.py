"""Flags the chosen mode does not read: refused in one line instead of silently ignored.

A command's flags are read by some of its modes only (``--sparsity`` by the pruning techniques,
``--split`` by ``export --evaluate``). A flag given on the command line that no chosen mode reads
would leave the user believing they asked for something they did not get, so each CLI keeps a
table (flag -> the modes that read it) and refuses such a flag before any work starts:

    given = explicit(parser, argv)  # what the user typed, defaults left out
    refuse_unused({"--sparsity": ("prune", "pqat", "pcqat")}, ("channel_prune",), given)
    # ConfigError: --sparsity is not used by channel_prune (it belongs to prune, pqat, pcqat); drop it

Only flags the user gives count (a default is never refused); a flag is fine when any chosen mode
reads it, and a flag the table does not list is read by every mode. A flag that another flag's
value turns off (``--taylor-batches`` without ``--importance taylor``, ``--cpu-replicas`` under a
strategy other than ``mirrored``) is refused by :func:`refuse_off`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Mapping, Sequence

from tfopt.core.errors import ConfigError


def explicit(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> set[str]:
    """The options ``argv`` gives explicitly, even those given their default value.

    ``argv`` is parsed again with every default suppressed, so ``--sparsity 0.8`` counts as given
    although 0.8 is the default. Call it after ``parser.parse_args(argv)`` succeeded: usage errors
    are that parse's to report.

    Args:
        parser: The command's parser.
        argv: The arguments (default ``sys.argv[1:]``, as argparse reads them).

    Returns:
        Each given option's first long name (``--output``, not ``-o``).
    """
    actions = [a for a in parser._actions if a.option_strings]
    defaults, parser_defaults = [a.default for a in actions], parser._defaults
    try:
        for action in actions:
            action.default = argparse.SUPPRESS
        parser._defaults = {}  # set_defaults() values would look given
        namespace, _ = parser.parse_known_args(argv, argparse.Namespace())
    finally:
        for action, default in zip(actions, defaults):
            action.default = default
        parser._defaults = parser_defaults
    return {_name(a) for a in actions if hasattr(namespace, a.dest)}


def _name(action: argparse.Action) -> str:
    return next((s for s in action.option_strings if s.startswith("--")), action.option_strings[0])


def join(names: Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def refuse_unused(
    users: Mapping[str, Collection[str]],
    chosen: Sequence[str],
    given: Collection[str],
    *,
    chosen_as: str | None = None,
    fix: Callable[[str, tuple[str, ...]], str] | None = None,
) -> None:
    """Raises ConfigError for the first listed flag in ``given`` that no ``chosen`` mode reads.

    Args:
        users: Flag -> the modes that read it (a flag not listed is read by every mode).
        chosen: The chosen modes.
        given: The options given explicitly (:func:`explicit`).
        chosen_as: How the message names the chosen modes (default: their names, comma-joined).
        fix: ``fix(flag, users)`` -> the fix the message ends with (default: "drop it").

    Raises:
        ConfigError: ``--sparsity is not used by channel_prune (it belongs to prune, pqat,
            pcqat); drop it``.
    """
    for flag, readers in users.items():
        readers = tuple(readers)
        if flag in given and not set(readers) & set(chosen):
            how = fix(flag, readers) if fix else "drop it"
            raise ConfigError(
                f"{flag} is not used by {chosen_as or ','.join(chosen)} "
                f"(it belongs to {', '.join(readers)}); {how}"
            )


def refuse_off(
    conditions: Mapping[str, tuple[bool, str, str, str | None]], given: Collection[str]
) -> None:
    """Raises ConfigError for the first flag in ``given`` that the other settings turn off.

    Some flags are read only for some values of another (``--taylor-batches`` with
    ``--importance taylor``, ``--cpu-replicas`` under ``--strategy mirrored``).

    Args:
        conditions: Flag -> (read, what is set now, what would read it, the fix or None for
            "give <what would read it>, or drop <flag>").
        given: The options given explicitly (:func:`explicit`).

    Raises:
        ConfigError: ``--taylor-batches is not used with --importance l1 (it needs --importance
            taylor); give --importance taylor, or drop --taylor-batches``.
    """
    for flag, (read, now, needs, fix) in conditions.items():
        if flag in given and not read:
            raise ConfigError(
                f"{flag} is not used with {now} (it needs {needs}); "
                f"{fix or f'give {needs}, or drop {flag}'}"
            )
