"""The stage contract (tfopt.core.stage): every built-in stage keeps it, the registry finds stages
by name without starting TensorFlow, and each stage's options become the settings its runner
took from the pipeline before."""

import subprocess
import sys

import pytest

from tfopt.core import stage
from tfopt.core.errors import ConfigError


def test_every_built_in_stage_keeps_the_contract_in_pipeline_order():
    assert stage.names() == ["train", "distill", "optimize", "export", "federated"]
    for name in stage.names():
        s = stage.get(name)
        assert isinstance(s, stage.Stage) and s.name == name
        assert s.trains == (name not in ("export", "federated"))


def test_finding_every_stage_starts_no_tensorflow():
    code = (
        "import sys\n"
        "from tfopt.core import stage\n"
        "for n in stage.names():\n"
        "    stage.get(n).check({})\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tf_keras', 'keras'))\n"
        "assert not bad, bad[:5]\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_an_unknown_stage_is_refused_in_one_line_naming_the_stages():
    with pytest.raises(ConfigError) as e:
        stage.get("quantize")
    msg = str(e.value)
    assert "'quantize'" in msg and "train, distill, optimize, export" in msg and "\n" not in msg


def test_a_registered_stage_is_found_and_replaces_a_built_in_one_until_unregistered(monkeypatch):
    monkeypatch.setattr(stage, "_REGISTERED", {})

    class Mine:
        name, trains = "export", False

        def check(self, options):
            pass

        def run(self, cfg, inputs, out_dir, *, options=None, overwrite=False):
            return None

    mine = stage.register(Mine())
    assert stage.get("export") is mine
    stage.unregister("export")
    assert stage.get("export") is not mine and type(stage.get("export")).__name__ == "ExportStage"
    with pytest.raises(TypeError, match="not a Stage"):
        stage.register(object())


@pytest.mark.parametrize(
    "name, options, fragment",
    [
        ("train", {"epochs": 1}, "option 'epochs' is not read by stage 'train'"),
        ("distill", {"alpha": 0.5}, "option 'alpha' is not read by stage 'distill'"),
        ("optimize", {"sparsity": 0.5}, "option 'sparsity' is not read by stage 'optimize'"),
        ("export", {"modes": ["int8"]}, "option 'modes' is not read by stage 'export'"),
    ],
)
def test_a_bad_option_is_refused_in_one_line(name, options, fragment):
    with pytest.raises(ConfigError) as e:
        stage.get(name).check(options)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_the_optimize_section_makes_the_settings_the_runner_takes():
    from tfopt import config as C
    from tfopt.compress.channel_prune import ChannelSpec
    from tfopt.compress.cluster import ClusterSpec
    from tfopt.compress.low_rank import LowRankSpec
    from tfopt.compress.prune import PruneSpec
    from tfopt.optimize.cli import build_parser, resolve_config
    from tfopt.optimize.runner import OptimizeSettings
    from tfopt.optimize.settings import settings_for

    cfg = C.from_dict(
        {"optimize": {"technique": "channel_prune", "sparsity": 0.6, "channels_flops": 0.4}}
    )
    cfg = C.from_dict({"optimize": {"epochs": 2}}, cfg)
    assert stage.get("optimize").settings(cfg) == OptimizeSettings(
        technique="channel_prune",
        prune=PruneSpec(sparsity=0.6),
        channels=ChannelSpec(flops=0.4),
        epochs=2,
    )
    # the section's defaults are the techniques' own: pruning and structural phases 3 epochs
    long = (("prune", 3), ("low_rank", 3), ("channel_prune", 3))
    assert settings_for(C.OptimizeConfig(), "cluster") == OptimizeSettings(
        technique="cluster",
        prune=PruneSpec(),
        cluster=ClusterSpec(),
        low_rank=LowRankSpec(),
        channels=ChannelSpec(),
        phase_epochs=long,
    )
    # the command line sets the same fields
    args = build_parser().parse_args(
        [
            "--from",
            "r",
            "--technique",
            "prune",
            "--sparsity",
            "0.6",
            "--phase-epochs",
            "prune=2",
            "--block-size",
            "4,1",
            "--no-tensorboard",
            "--lr",
            "1e-3",
        ]
    )
    o = resolve_config(args, C.RunConfig()).optimize
    got = settings_for(o, "prune")
    assert got == OptimizeSettings(
        technique="prune",
        prune=PruneSpec(sparsity=0.6, block_size=(4, 1)),
        learning_rate=1e-3,
        phase_epochs=(("prune", 2), ("low_rank", 3), ("channel_prune", 3)),
        tensorboard=False,
    )
    with pytest.raises(ConfigError, match="stage 'optimize' runs one technique"):
        stage.get("optimize").settings(C.from_dict({"optimize": {"technique": "prune,qat"}}))


def test_the_export_section_makes_the_settings_the_runner_takes():
    from tfopt import config as C
    from tfopt.export.choices import MODES
    from tfopt.export.settings import BenchSettings, ExportSettings

    cfg = C.from_dict({"export": {"modes": "int8,float32,int8", "threads": "1", "runs": 5}})
    cfg = C.from_dict({"export": {"warmup": 1}}, cfg)
    assert stage.get("export").settings(cfg) == ExportSettings(
        modes=("int8", "float32"), bench=BenchSettings(threads=(1,), runs=5, warmup=1)
    )
    assert stage.get("export").settings(C.RunConfig()) == ExportSettings()  # one set of defaults
    assert C.MODE_NAMES == tuple(MODES.names())  # the config's list is the registry's
    for raw, fragment in (
        ({"modes": "float32,int4"}, "unknown mode 'int4'"),
        ({"threads": "0"}, "thread count 0 must be >= 1"),
        ({"runs": 0}, "export.runs=0 must be >= 1"),
    ):
        with pytest.raises(ConfigError, match=fragment):
            C.from_dict({"export": raw})


def test_the_pipeline_hands_each_stage_its_config_inputs_and_options():
    from tfopt import config as C
    from tfopt.pipeline import apply_overrides, load_pipeline, plan
    from tfopt.pipeline.config import find_pipeline

    cfg = apply_overrides(
        load_pipeline(find_pipeline("mnist_edge"), "smoke"),
        ["student.alpha=0.3", "compress.techniques=pqat,channel_prune", "export.runs=7"],
    )
    stages = {s.name: s for s in plan(cfg)}
    assert stages["student"].config.distill.alpha == 0.3 and stages["student"].options == {}
    assert stages["student"].config.model.name == cfg.student.model
    assert stages["teacher"].config.model.name == cfg.teacher.model
    pruned = stages["student-channel_prune"]
    assert pruned.kind == "optimize" and pruned.inputs == ("student",) and pruned.options == {}
    o = pruned.config.optimize
    assert (o.technique, o.channels_flops, o.sparsity) == (
        "channel_prune",
        cfg.compress.flops,
        cfg.compress.sparsity,
    )
    assert pruned.config.model == stages["student"].config.model
    pqat = stages["student-pqat"].config.optimize  # pqat reads no multiply-add target
    assert pqat.technique == "pqat" and pqat.channels_flops == C.OptimizeConfig().channels_flops
    assert stages["student-pqat-export"].config.export.modes == "int8"
    assert stages["teacher-export"].config.export.runs == 7
    for s in stages.values():  # every option is one its stage reads
        stage.get(s.kind).check(s.options)


@pytest.mark.slow
def test_train_fine_tunes_the_model_of_the_run_it_is_given(mnist_run, tmp_path):
    import os

    from tfopt import config as C
    from tfopt.runs import load_run

    cfg = C.from_dict(
        {
            "data": {"limit": 512},
            "train": {"epochs": 1, "learning_rate": 1e-9, "verbose": 0, "tensorboard": False},
        },
        load_run(mnist_run).config,
    )
    out = str(tmp_path / "tuned")
    record = stage.get("train").run(cfg, [mnist_run], out)
    assert record.config["model"]["name"] == os.path.join(mnist_run, "model.keras")
    assert record.config["train"]["output_dir"] == out
    # the input's trained weights: a new CNN at a learning rate of 1e-9 stays near chance (~10%)
    assert record.metrics["test_accuracy"] > 0.9


def test_the_top_level_lists_what_it_offers_and_runs_a_stage_by_name(monkeypatch):
    import tfopt

    assert set(tfopt.__all__) == {*tfopt._EXPORTS, "__version__", "config", "run_stage"}
    for name in tfopt.__all__:
        assert getattr(tfopt, name) is not None, name
    assert tfopt.stage_names() == stage.names() and tfopt.load_run.__module__ == "tfopt.runs"
    seen = {}

    class Echo:
        name, trains = "echo", False

        def check(self, options):
            pass

        def run(self, cfg, inputs, out_dir, *, options=None, overwrite=False):
            seen.update(
                cfg=cfg, inputs=inputs, out_dir=out_dir, options=options, overwrite=overwrite
            )
            return "record"

    monkeypatch.setattr(stage, "_REGISTERED", {})
    tfopt.register_stage(Echo())
    cfg = tfopt.RunConfig()
    assert tfopt.run_stage("echo", cfg, ("a",), "out", options={"k": 1}, overwrite=True) == "record"
    assert seen == dict(cfg=cfg, inputs=["a"], out_dir="out", options={"k": 1}, overwrite=True)


@pytest.mark.parametrize("name", ["optimize", "export"])
@pytest.mark.parametrize("inputs", [[], ["runs/a", "runs/b"]])
def test_a_stage_that_reads_one_input_refuses_none_or_two(name, inputs, tmp_path):
    from tfopt.config import RunConfig

    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=f"stage '{name}' reads one input .*not {len(inputs)}"):
        stage.get(name).run(RunConfig(), inputs, str(out))
    assert not out.exists()
