"""A flag the chosen technique or mode does not read is refused in one line, never ignored.

Table-driven and TensorFlow-free: every command line is only parsed and checked (the CLIs'
``check_flags``), so the whole file runs in about a second. The expectations below are written
out by hand from the code that reads each flag; they do not come from the CLIs' own tables, so
an entry missing there (a flag silently ignored again) fails here.
"""

import argparse

import pytest

from tfopt.compress.techniques import ONE_PHASE, TECHNIQUES
from tfopt.core import flagcheck
from tfopt.core.errors import ConfigError
from tfopt.distill import cli as distill_cli
from tfopt.export import cli as export_cli
from tfopt.export.choices import MODES
from tfopt.optimize import cli as optimize_cli

# ---- tfopt optimize: technique -> the technique flags it reads --------------------------------

SCHEDULE = {  # a pruning phase on a sparsity schedule (prune_2of4's mask is computed without one)
    "--sparsity",
    "--schedule",
    "--initial-sparsity",
    "--begin-step",
    "--end-step",
    "--frequency",
    "--block-size",
}
PRUNE = SCHEDULE | {"--policy"}
CLUSTER = {"--clusters", "--centroid-init", "--per-channel"}
LOW_RANK = {
    "--low-rank-by",
    "--low-rank-flops",
    "--low-rank-energy",
    "--low-rank-round-to",
    "--low-rank-conv",
}
CHANNELS = {
    "--channels-flops",
    "--channels-ratio",
    "--target-latency-us",
    "--latency-threads",
    "--importance",
    "--taylor-batches",
    "--ranking",
    "--round-to",
    "--prune-iterations",
}
OPTIMIZE_READS = {
    "prune": PRUNE,
    "prune_2of4": {"--policy"},
    "qat": set(),
    "cluster": CLUSTER,
    "pqat": PRUNE,
    "cqat": CLUSTER,
    "pcqat": PRUNE | CLUSTER,
    "low_rank": LOW_RANK,
    "low_rank_qat": LOW_RANK,
    "channel_prune": CHANNELS,
    "channel_prune_qat": CHANNELS,
    "--inspect": set(),
}
TECHNIQUE_GROUPS = ("pruning", "clustering", "low-rank factorization", "channel pruning")

# Read only for some values of another flag: the value that turns each on, and the flag with
# one that turns it off, with how the refusal names that setting and what would read it.
ON = {
    "--taylor-batches": ["--importance", "taylor"],
    "--latency-threads": ["--target-latency-us", "300"],
    "--low-rank-energy": ["--low-rank-by", "energy"],
}
OFF = [
    (
        "channel_prune",
        "--taylor-batches",
        ["--importance", "bn"],
        "--importance bn",
        "--importance taylor",
    ),
    ("channel_prune", "--latency-threads", [], "no --target-latency-us", "--target-latency-us US"),
    (
        "channel_prune",
        "--channels-flops",
        ["--channels-ratio", "0.3"],
        "--channels-ratio 0.3",
        "no other channel target",
    ),
    (
        "channel_prune",
        "--channels-flops",
        ["--target-latency-us", "300"],
        "--target-latency-us 300",
        "no other channel target",
    ),
    (
        "prune",
        "--initial-sparsity",
        ["--schedule", "constant"],
        "--schedule constant",
        "--schedule polynomial",
    ),
    (
        "low_rank",
        "--low-rank-flops",
        ["--low-rank-by", "energy"],
        "--low-rank-by energy",
        "--low-rank-by flops",
    ),
    ("low_rank", "--low-rank-energy", [], "--low-rank-by flops", "--low-rank-by energy"),
]

# ---- tfopt export: flag -> who reads it (a --modes name, --evaluate, --benchmark) -----------

ALL_MODES = set(MODES.names())
QUANTIZER_MODES = {
    "dynamic_selective",
    "dynamic_auto",
    "int8_weights",
    "int4_weights",
    "recipe",
}  # ai-edge-quantizer
EVALUATE, BENCHMARK = "--evaluate", "--benchmark"
EXPORT_READERS = {
    "--modes": ALL_MODES,
    "--io": {"int8", "int8_auto"},
    "--calibration-steps": {"int8", "int8_auto", "int16x8", "recipe"},
    "--float-layers": {"int8"},
    "--allow-select-tf-ops": ALL_MODES,
    "--sparsity": ALL_MODES - QUANTIZER_MODES,  # the converter's sparse encoding
    "--recipe": {"recipe"},
    "--quantizer": {"dynamic", "float16", "int8", "int16x8"},
    "--strip-strings": ALL_MODES,
    "--auto-candidates": {"int8_auto"},
    "--min-agreement": ALL_MODES,
    "--max-accuracy-drop": ALL_MODES,
    "--no-selective": {"int8"},
    "--max-float-layers": {"int8"},
    "--search-limit": {"int8", "int8_auto"},
    "--eval-limit": ALL_MODES | {EVALUATE},
    "--split": {EVALUATE},
    "--keras": {EVALUATE, BENCHMARK},
    "--threads": ALL_MODES | {BENCHMARK},
    "--runs": ALL_MODES | {BENCHMARK},
    "--warmup": ALL_MODES | {BENCHMARK},
    "--rounds": ALL_MODES | {BENCHMARK},
    "--device": ALL_MODES | {BENCHMARK},
    "--benchmark-binary": ALL_MODES | {BENCHMARK},
    "--kernels": ALL_MODES | {BENCHMARK},
    "--runtime": ALL_MODES | {BENCHMARK},
    "--litert-benchmark": ALL_MODES | {BENCHMARK},
    "--no-keras-latency": ALL_MODES,
    "--overwrite": ALL_MODES,
    "--no-plot": ALL_MODES,
}
# Read by every run: never refused (--input-scale included, whoever adds or changes it).
EXPORT_EVERYWHERE = ("--dataset", "--data-dir", "--image-size", "--channels", "--normalize")
EXPORT_EVERYWHERE += ("--input-scale", "--output", "--trust-model", "--quiet", "--verbose")

# ---- tfopt distill: --technique -> the compression flags it reads -----------------------------

DISTILL_READS = {"none": set(), "prune": {"--sparsity"}, "qat": set(), "cluster": {"--clusters"}}


def _actions(parser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def _with_value(parser, flag: str) -> list[str]:
    """``flag`` and a value its parser accepts (none for a switch)."""
    action = _actions(parser)[flag]
    if action.nargs == 0:
        return [flag]
    if action.choices:
        return [flag, str(next(iter(action.choices)))]
    valid = {"HxW": "8x8", "MEAN/STD": "0.5/0.5"}.get(action.metavar)  # text parsed by the config
    if (action.metavar or "").startswith("{"):  # the config's choices, shown
        valid = action.metavar.strip("{}").split(",")[0]
    valid = valid or {"--runtime": "latest"}.get(flag, "4,1")
    return [flag, {int: "16", float: "0.5"}.get(action.type, valid)]


def _check(module, parser, argv: list[str]) -> str | None:
    """The refusal ``module.check_flags`` raises for ``argv`` (None: accepted)."""
    args = parser.parse_args(argv)
    try:
        module.check_flags(args, flagcheck.explicit(parser, argv))
    except ConfigError as e:
        assert e.exit_code == 2  # the CLIs print it as one line and exit 2 (cli.run_main)
        return str(e)
    return None


def _one_line(msg: str, flag: str, chosen: str, owners: list[str]) -> str:
    """Checks the shape every refusal shares; returns its fix (after the owners)."""
    assert "\n" not in msg and msg.startswith(f"{flag} is not used by {chosen} (it belongs to "), (
        msg
    )
    head, _, fix = msg.partition("); ")
    assert head.endswith(f"(it belongs to {', '.join(owners)}"), (msg, owners)
    assert fix.strip(), msg
    return fix


@pytest.fixture(scope="module")
def optimize_parser():
    return optimize_cli.build_parser()


def test_the_expectations_cover_every_technique_and_every_technique_flag(optimize_parser):
    assert set(OPTIMIZE_READS) == set(TECHNIQUES) | {"--inspect"}
    grouped = {
        s
        for g in optimize_parser._action_groups
        if g.title in TECHNIQUE_GROUPS
        for a in g._group_actions
        for s in a.option_strings
    }
    assert grouped == set().union(*OPTIMIZE_READS.values())


@pytest.mark.parametrize("technique", sorted(OPTIMIZE_READS))
def test_optimize_refuses_each_technique_flag_its_technique_does_not_read(
    optimize_parser, technique
):
    head = ["--from", "runs/x"] + (
        ["--inspect"] if technique == "--inspect" else ["--technique", technique]
    )
    reads = OPTIMIZE_READS[technique]
    for flag in sorted(set().union(*OPTIMIZE_READS.values())):
        if flag in reads:  # with the value of another flag that turns it on, where one does
            on = ON.get(flag, [])
            msg = _check(
                optimize_cli, optimize_parser, head + on + _with_value(optimize_parser, flag)
            )
            assert msg is None, (technique, flag, msg)
            continue
        msg = _check(optimize_cli, optimize_parser, head + _with_value(optimize_parser, flag))
        assert msg is not None, f"{flag} with {technique} is silently ignored"
        owners = [t for t in TECHNIQUES if flag in OPTIMIZE_READS[t]]
        fix = _one_line(msg, flag, technique, owners)
        assert fix.startswith(f"{technique} takes "), msg
        if reads:
            assert all(f in fix for f in reads), (msg, reads)
        else:
            assert fix == f"{technique} takes none of these flags", msg


def test_optimize_counts_a_flag_given_its_default_value_or_abbreviated(optimize_parser):
    argv = ["--from", "runs/x", "--technique", "channel_prune"]
    assert "--sparsity is not used" in _check(
        optimize_cli, optimize_parser, argv + ["--sparsity", "0.8"]
    )  # 0.8 is the default: typed, it is still believed to do something
    assert "--sparsity is not used" in _check(optimize_cli, optimize_parser, argv + ["--spars=0.5"])
    assert (
        _check(optimize_cli, optimize_parser, argv + ["--round-to", "8", "--epochs", "2"]) is None
    )


def test_optimize_with_several_techniques_takes_a_flag_any_of_them_reads(optimize_parser):
    argv = ["--from", "runs/x", "--technique", "prune,channel_prune"]
    assert (
        _check(optimize_cli, optimize_parser, argv + ["--sparsity", "0.5", "--round-to", "8"])
        is None
    )
    msg = _check(optimize_cli, optimize_parser, argv + ["--clusters", "8"])
    fix = _one_line(msg, "--clusters", "prune,channel_prune", ["cluster", "cqat", "pcqat"])
    assert (
        fix.startswith("prune takes --sparsity") and "; channel_prune takes --channels-flops" in fix
    )
    assert "technique 'magic' is not valid" in _check(
        optimize_cli, optimize_parser, ["--from", "runs/x", "--technique", "prune,magic"]
    )


def test_optimize_main_prints_the_refusal_on_one_line_and_exits_2(capsys):
    argv = ["--from", "runs/none", "--technique", "channel_prune", "--sparsity", "0.5"]
    assert optimize_cli.main(argv) == 2  # refused before the run is even looked for
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "tfopt optimize: error: --sparsity is not used by channel_prune (it belongs to prune, "
        "pqat, pcqat); channel_prune takes --channels-flops, --channels-ratio, --target-latency-us"
    ), err


@pytest.fixture(scope="module")
def export_parser():
    return export_cli.build_parser()


EXPORT_CHOICES = sorted(ALL_MODES) + [EVALUATE, BENCHMARK]


def test_the_export_expectations_name_only_flags_and_readers_that_exist(export_parser):
    actions = _actions(export_parser)
    assert all(flag in actions for flag in EXPORT_READERS)
    assert set().union(*EXPORT_READERS.values()) <= set(EXPORT_CHOICES)


@pytest.mark.parametrize("chosen", EXPORT_CHOICES)
def test_export_refuses_each_flag_its_mode_or_action_does_not_read(export_parser, chosen):
    if chosen in ALL_MODES:
        head = ["--from", "runs/x", "--modes", chosen]
    else:
        head = [chosen, "model.tflite"]
    for flag, readers in EXPORT_READERS.items():
        extra = (
            [] if (flag == "--modes" and chosen in ALL_MODES) else _with_value(export_parser, flag)
        )
        msg = _check(export_cli, export_parser, head + extra)
        if chosen in readers:
            assert msg is None, (chosen, flag, msg)
            continue
        assert msg is not None, f"{flag} with {chosen} is silently ignored"
        if chosen in ALL_MODES and readers & ALL_MODES:  # another mode reads it
            owners = [m for m in MODES.names() if m in readers]
            fix = _one_line(msg, flag, f"--modes {chosen}", owners)
            assert fix == f"add {flagcheck.join(owners)} to --modes, or drop {flag}", msg
        elif chosen in ALL_MODES:  # --evaluate or --benchmark reads it
            owners = [a for a in (EVALUATE, BENCHMARK) if a in readers]
            fix = _one_line(msg, flag, "--from", owners)
            assert fix == f"use it with {flagcheck.join(owners)}, or drop it", msg
        else:
            owners = (["--from"] if readers & ALL_MODES else []) + [
                a for a in (EVALUATE, BENCHMARK) if a in readers
            ]
            fix = _one_line(msg, flag, chosen, owners)
            takes = [f for f, r in EXPORT_READERS.items() if chosen in r]
            assert fix == f"{chosen} takes {flagcheck.join(takes)}", msg
    for flag in EXPORT_EVERYWHERE:
        if flag in _actions(export_parser):
            extra = _with_value(export_parser, flag)
            assert _check(export_cli, export_parser, head + extra) is None, (chosen, flag)


def test_export_with_several_modes_takes_a_flag_any_of_them_reads(export_parser):
    argv = ["--from", "runs/x", "--modes", "float32,int16x8", "--calibration-steps", "5"]
    assert _check(export_cli, export_parser, argv) is None
    assert (
        _check(export_cli, export_parser, ["--from", "runs/x", "--float-layers", "conv0"]) is None
    )
    msg = _check(export_cli, export_parser, argv + ["--io", "int8"])
    assert msg.startswith(
        "--io is not used by --modes float32,int16x8 (it belongs to int8, int8_auto)"
    )


def test_export_main_prints_the_refusal_on_one_line_and_exits_2(capsys):
    argv = ["--from", "runs/none", "--modes", "float32", "--calibration-steps", "5"]
    assert export_cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "tfopt export: error: --calibration-steps is not used by --modes float32 (it belongs to "
        "int8, int8_auto, int16x8, recipe); add int8, int8_auto, int16x8 or recipe to --modes, or "
        "drop --calibration-steps"
    ], err


def test_the_distill_expectations_cover_every_technique():
    assert set(DISTILL_READS) == set(ONE_PHASE)


@pytest.mark.parametrize("technique", ONE_PHASE)
def test_distill_refuses_sparsity_and_clusters_without_their_technique(technique):
    parser = distill_cli.build_parser()
    for flag, owner in (("--sparsity", "prune"), ("--clusters", "cluster")):
        argv = ["--teacher", "runs/x", "--technique", technique] + _with_value(parser, flag)
        msg = _check(distill_cli, parser, argv)
        if flag in DISTILL_READS[technique]:
            assert msg is None, msg
            continue
        assert msg is not None, f"{flag} with --technique {technique} is silently ignored"
        fix = _one_line(msg, flag, f"--technique {technique}", [owner])
        assert fix.endswith(f"give --technique {owner}, or drop {flag}"), msg
        if DISTILL_READS[technique]:
            assert fix.startswith(f"{technique} takes {next(iter(DISTILL_READS[technique]))}"), msg


def test_distill_main_prints_the_refusal_on_one_line_and_exits_2(capsys):
    argv = ["--teacher", "runs/none", "--technique", "cluster", "--sparsity", "0.5"]
    assert distill_cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "tfopt distill: error: --sparsity is not used by --technique cluster (it belongs to prune)"
    ), err


@pytest.mark.parametrize("technique, flag, setting, now, needs", OFF)
def test_optimize_refuses_a_flag_another_flags_value_turns_off(
    optimize_parser, technique, flag, setting, now, needs
):
    head = ["--from", "runs/x", "--technique", technique] + setting
    msg = _check(optimize_cli, optimize_parser, head + _with_value(optimize_parser, flag))
    assert msg is not None, f"{flag} with {' '.join(setting)} is silently ignored"
    assert "\n" not in msg and msg.startswith(f"{flag} is not used with {now} (it needs {needs}); ")
    assert _check(optimize_cli, optimize_parser, head) is None  # the setting alone is fine


# ---- every training-like command: flags the resolved config's strategy or data do not read ----

CONFIG_OFF = [  # (flag and value, settings that turn it on, settings that leave it unread)
    (["--cpu-replicas", "2"], ["--strategy", "mirrored"], ["--strategy", "one_device"]),
    (["--collective", "ring"], ["--strategy", "multi_worker_mirrored"], ["--strategy", "mirrored"]),
    (["--data-service-mode", "parallel_epochs"], ["--data-service", "local"], []),
]


@pytest.mark.parametrize("flag, on, off", CONFIG_OFF, ids=lambda v: " ".join(v))
def test_train_and_distill_refuse_a_distribution_flag_their_config_does_not_read(flag, on, off):
    from tfopt import config
    from tfopt.config import cli
    from tfopt.train import cli as train_cli

    for module, head in (
        (train_cli, []),
        (distill_cli, ["--teacher", "runs/x"]),
    ):
        parser = module.build_parser()
        for setting, refused in ((on, False), (off, True)):
            argv = head + setting + flag
            args = parser.parse_args(argv)
            cfg = cli.config_from_args(args)
            try:
                cli.check_config_flags(cfg, flagcheck.explicit(parser, argv))
                msg = None
            except ConfigError as e:
                msg = str(e)
            if not refused:
                assert msg is None, (module.PROG, argv, msg)
            else:
                assert msg is not None, f"{flag[0]} with {off} is silently ignored by {module.PROG}"
                assert msg.startswith(f"{flag[0]} is not used with "), msg
    # A strategy set in a config file counts as much as --strategy.
    cfg = config.from_dict({"runtime": {"strategy": "mirrored"}}, config.RunConfig())
    cli.check_config_flags(cfg, {"--cpu-replicas"})


def test_train_main_prints_the_refusal_on_one_line_and_exits_2(capsys):
    from tfopt.train import cli as train_cli

    assert train_cli.main(["--strategy", "one_device", "--cpu-replicas", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "tfopt train: error: --cpu-replicas is not used with --strategy one_device (it needs "
        "--strategy mirrored); give --strategy mirrored, or drop --cpu-replicas"
    ], err


def test_optimize_refuses_a_distribution_flag_its_resolved_strategy_does_not_read():
    # optimize reads its strategy from the input run, so the check runs on the resolved config
    from tfopt import config
    from tfopt.config import cli

    cfg = optimize_cli.resolve_config(
        optimize_cli.build_parser().parse_args(
            ["--from", "runs/x", "--technique", "qat", "--collective", "ring"]
        ),
        config.from_dict({"runtime": {"strategy": "one_device"}}, config.RunConfig()),
    )
    with pytest.raises(ConfigError, match="^--collective is not used with --strategy one_device"):
        cli.check_config_flags(cfg, {"--collective"})


@pytest.mark.parametrize(
    "extra, refused",
    [
        (["--combine", "logits"], "--combine is not used with one --teacher"),
        (["--teacher-weights", "accuracy"], "--teacher-weights is not used with one --teacher"),
        (["--feature-weight", "2"], "--feature-weight is not used with no --feature"),
        (["--teacher", "runs/y", "--combine", "logits", "--teacher-weights", "1,2"], None),
        (["--feature", "conv:conv", "--feature-weight", "2"], None),
    ],
)
def test_distill_refuses_several_teacher_and_feature_flags_without_them(extra, refused):
    parser = distill_cli.build_parser()
    msg = _check(distill_cli, parser, ["--teacher", "runs/x"] + extra)
    assert (msg is None) if refused is None else msg.startswith(refused), msg
