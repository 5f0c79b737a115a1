"""The command lines explain themselves: every option has help, train's are grouped, defaults shown."""

import importlib

import pytest

from tfopt import cli

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
    assert "trust_model_file" in groups["model"] and "output" in groups["output"]
    help_text = parser.format_help()
    assert "{one_device,mirrored,multi_worker_mirrored,parameter_server}" in help_text
    # every config flag says its default: the value RunConfig() gives it
    by_dest = {a.dest: a for a in parser._actions}
    for dest in cli._FLAG_KEYS:
        if dest in by_dest and dest != "output":
            assert "default" in by_dest[dest].help, dest
    assert (
        "(default: 3)" in by_dest["epochs"].help
        and "(default: mirrored)" in by_dest["strategy"].help
    )
