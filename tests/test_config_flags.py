"""A setting is one field: its flag, help, default, parsing and --print-config follow from it."""

import json
from dataclasses import dataclass, field

import pytest

from tfopt import config as config_lib
from tfopt.config import cli
from tfopt.core import flagcheck
from tfopt.core.errors import ConfigError
from tfopt.distill import cli as distill_cli
from tfopt.train import cli as train_cli


@dataclass(frozen=True)
class _Train(config_lib.TrainConfig):
    warmup_steps: int = config_lib.flag(
        0, "--warmup-steps", "steps of linear learning-rate warm-up", metavar="N"
    )


@dataclass(frozen=True)
class _Distill(config_lib.DistillConfig):
    prune_layers: str = config_lib.flag(
        "", "--prune-layers", "layers --technique prune may prune", read_by=("prune",)
    )


@dataclass(frozen=True)
class _Run(config_lib.RunConfig):
    train: _Train = field(default_factory=_Train)
    distill: _Distill = field(default_factory=_Distill)


@pytest.fixture
def dummy_field(monkeypatch):
    monkeypatch.setattr(config_lib, "RunConfig", _Run)


def test_a_stage_field_is_its_stages_flag_read_by_what_its_metadata_names(dummy_field, capsys):
    parser = distill_cli.build_parser()
    action = next(
        a for a in cli.group(parser, "distillation")._group_actions if a.dest == "prune_layers"
    )
    assert action.help == "layers --technique prune may prune"
    assert "--prune-layers" not in train_cli.build_parser().format_help()  # train does not read it
    argv = ["--teacher", "runs/x", "--prune-layers", "conv0"]
    with pytest.raises(ConfigError) as e:
        distill_cli.check_flags(parser.parse_args(argv), flagcheck.explicit(parser, argv))
    assert str(e.value) == (
        "--prune-layers is not used by --technique none (it belongs to prune); give --technique "
        "prune, or drop --prune-layers"
    )
    assert distill_cli.main([*argv, "--technique", "prune", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["distill"]["prune_layers"] == "conv0"


def test_a_new_field_is_a_flag_with_help_default_and_group(dummy_field):
    parser = train_cli.build_parser()
    training = cli.group(parser, "training")
    action = next(a for a in training._group_actions if a.dest == "warmup_steps")
    assert action.option_strings == ["--warmup-steps"] and action.metavar == "N"
    assert action.help == "steps of linear learning-rate warm-up (default: 0)"
    assert "--warmup-steps N" in parser.format_help()
    assert cli.flag_keys()["warmup_steps"] == ("train", "warmup_steps")


def test_a_new_field_is_set_by_its_flag_by_set_and_printed(dummy_field, capsys):
    cfg = cli.config_from_args(train_cli.build_parser().parse_args(["--warmup-steps", "7"]))
    assert cfg.train.warmup_steps == 7
    cfg = cli.config_from_args(
        train_cli.build_parser().parse_args(["--set", "train.warmup_steps=5"])
    )
    assert cfg.train.warmup_steps == 5
    assert train_cli.main(["--warmup-steps", "9", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["train"]["warmup_steps"] == 9
    with pytest.raises(ConfigError, match=r"train\.warmup_steps='x' is not an int"):
        cli.config_from_args(train_cli.build_parser().parse_args(["--set", "train.warmup_steps=x"]))


def test_every_flag_of_the_config_tree_is_on_the_command_line_once():
    from tfopt.optimize import cli as optimize_cli

    for module, sections, shared in (
        (train_cli, config_lib.STAGE_SECTIONS["train"], ()),
        (distill_cli, config_lib.STAGE_SECTIONS["distill"], ()),
        (optimize_cli, ("optimize",), optimize_cli.SHARED),
    ):
        parser = module.build_parser()
        options = [o for a in parser._actions for o in a.option_strings]
        assert len(options) == len(set(options)), module
        keys = parser.get_default("config_keys")
        for section, f, flag in cli.config_flags():
            wanted = section in sections or f"{section}.{f.name}" in shared
            assert ((section, f.name) in keys.values()) == wanted, (module, section, f.name)
            if wanted:
                assert keys[cli._dest(flag.name)] == (section, f.name)
    # choices come from the config's own lists: one list per setting
    strategy = next(a for a in parser._actions if a.dest == "strategy")
    assert strategy.metavar == "{" + ",".join(config_lib.choices_of("runtime", "strategy")) + "}"
