"""The command lines explain themselves: every option has help, train's are grouped, defaults shown."""

import importlib

import pytest

from tfopt.config import cli

PARSERS = {
    "train": ("tfopt.train.cli", None),
    "distill": ("tfopt.distill.cli", "build_parser"),
    "optimize": ("tfopt.optimize.cli", "build_parser"),
    "export": ("tfopt.export.cli", "build_parser"),
    "pipeline": ("tfopt.pipeline.cli", "build_parser"),
    "launch": ("tfopt.launch", "build_parser"),
}


def _parser(command):
    module, factory = PARSERS[command]
    mod = importlib.import_module(module)
    if factory is None:  # train builds its parser inside main: catch it there
        captured = {}

        def parse_args(self, argv=None):
            captured["parser"] = self
            raise SystemExit(0)

        original = cli.ArgumentParser.parse_args
        cli.ArgumentParser.parse_args = parse_args
        try:
            with pytest.raises(SystemExit):
                mod.main([])
        finally:
            cli.ArgumentParser.parse_args = original
        return captured["parser"]
    return getattr(mod, factory)()


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_option_has_help(command):
    parser = _parser(command)
    bare = [a.option_strings for a in parser._actions if a.option_strings and not a.help]
    assert bare == [], f"tfopt {command}: options without help: {bare}"


def test_train_groups_its_options_and_shows_defaults_and_choices():
    parser = _parser("train")
    groups = {g.title: [a.dest for a in g._group_actions] for g in parser._action_groups}
    for title in ("configuration", "data", "model", "distribution", "training", "output"):
        assert groups.get(title), (title, groups)
    assert "strategy" in groups["distribution"] and "epochs" in groups["training"]
    assert "trust_model" in groups["model"] and "output" in groups["output"]
    help_text = parser.format_help()
    assert "{one_device,mirrored,multi_worker_mirrored,parameter_server,pipeline}" in help_text
    # every config flag says its default: the value RunConfig() gives it
    by_dest = {a.dest: a for a in parser._actions}
    for dest in cli.flag_keys():
        if dest in by_dest and dest != "output":
            assert "default" in by_dest[dest].help, dest
    assert (
        "(default: 3)" in by_dest["epochs"].help
        and "(default: mirrored)" in by_dest["strategy"].help
    )


def _every_flag() -> set[str]:
    """The option strings of every command ``tfopt --help`` lists (each parser as its main builds it)."""
    import argparse

    from tfopt.__main__ import COMMANDS

    captured = []

    def parse_args(self, argv=None, namespace=None):
        captured.append(self)
        raise SystemExit(0)

    originals = {
        k: k.__dict__.get("parse_args") for k in (argparse.ArgumentParser, cli.ArgumentParser)
    }
    for klass in originals:
        klass.parse_args = parse_args
    try:
        for module, _ in COMMANDS.values():
            mod = importlib.import_module(module)
            if module == "tfopt.core.cpu":  # no parser: its flags are --refresh and --here
                continue
            with pytest.raises(SystemExit):
                mod.main(["--help"])
    finally:
        for klass, original in originals.items():
            if original is None:
                del klass.parse_args
            else:
                klass.parse_args = original
    flags = {"--refresh", "--here", "--help", "--version"}
    for parser in captured:
        for action in parser._actions:
            flags.update(o for o in action.option_strings if o.startswith("--"))
    return flags


# Flags of tfopt's internal child commands (keras_latency, data.serve) and of other programs its
# messages name (tensorboard --logdir, pip --no-deps, flower-supernode --node-config).
FOREIGN = {
    "--serve",
    "--port",
    "--work-dir",
    "--dispatcher",
    "--logdir",
    "--no-deps",
    "--node-config",
}


def test_every_flag_an_error_message_advises_exists():
    """Walks every string in tfopt's code: a ``--flag`` it names is a flag of some tfopt command."""
    import ast
    import pathlib
    import re

    known = _every_flag() | FOREIGN
    unknown = {}
    for path in pathlib.Path(cli.__file__).parent.rglob("*.py"):
        if path.name == "render.py":  # the report's CSS: --fg, --muted are custom properties
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
            and n.body
            and isinstance(n.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if id(node) in docstrings:  # documentation may name other programs' flags
                continue
            # a message is text: an argument list's lone "--flag" is another program's argv
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and " " in node.value:
                for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]", node.value):
                    if flag not in known:
                        unknown.setdefault(flag, str(path.relative_to(path.parents[1])))
    assert not unknown, f"messages name flags no tfopt command has: {unknown}"


def test_every_help_answers_without_starting_tensorflow():
    """``--help`` costs an interpreter start, not TensorFlow's import (seconds): no command loads it."""
    import subprocess
    import sys

    from tfopt.__main__ import COMMANDS

    script = (
        "import contextlib, io, sys\n"
        "from tfopt.__main__ import main\n"
        "for command in sys.argv[1:]:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            main([command, '--help'])\n"
        "        except SystemExit:\n"
        "            pass\n"
        "    print(command, 'tensorflow' in sys.modules)\n"
    )
    commands = list(COMMANDS)
    out = subprocess.run(
        [sys.executable, "-c", script, *commands], capture_output=True, text=True, check=True
    ).stdout.split()
    assert dict(zip(out[::2], out[1::2])) == {c: "False" for c in commands}


def test_the_runtime_options_are_no_other_sections_options():
    """Every training command takes the runtime section beside its own: an option of both would
    be read for one and refused or ignored for the other (``--schedule`` was optimize's)."""
    runtime = {n for s, _, f in cli.config_flags(("runtime",)) for n in (f.name, *f.aliases)}
    others = {n for s, _, f in cli.config_flags() if s != "runtime" for n in (f.name, *f.aliases)}
    assert runtime & others == set()
