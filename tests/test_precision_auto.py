"""``--precision auto`` and the warning for mixed_bfloat16 without bf16 hardware.

- The decision (:mod:`tfopt.runtime.autoprecision`): the faster policy wins, float32 keeps ties
  and gains within the margin, the throughput comes from the median execution time, the timed
  executions take turns, and the log line says what was measured and why.
- The warning: flags parsed from given cpuinfo texts (x86 and arm64), one line, printed once.
- The config and the CLIs: ``auto`` accepted, an unknown value a one-line error naming the choices.
- A real run with ``auto``: run.json records the probe and the policy it chose, and the run is
  bit-identical to a run of that policy named explicitly (the probe changed neither the initial
  weights nor the data order).
"""

import json
import os
import statistics
import subprocess
import sys

import pytest

from tfopt import config as C
from tfopt.core.cpu import cpu_flags, cpu_info, parse_cpuinfo
from tfopt.core.errors import ConfigError
from tfopt.runtime import autoprecision as ap
from tfopt.runtime import precision

X86_NO_BF16 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2
processor\t: 1
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2
"""
X86_AVX512_BF16 = "model name\t: AMD EPYC 9B14\nflags\t\t: avx2 avx512f avx512_vnni avx512_bf16\n"
X86_AMX = (
    "model name\t: Intel(R) Xeon(R) Platinum 8481C\nflags\t\t: avx512f amx_bf16 amx_tile amx_int8\n"
)
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm bf16 i8mm\n"


# -- the decision ----------------------------------------------------------------------------------


def test_the_faster_policy_wins_and_ties_go_to_float32():
    assert ap.choose({"float32": 400.0, "mixed_bfloat16": 900.0}) == (
        "mixed_bfloat16",
        "mixed_bfloat16 is 2.25x float32",
    )
    assert ap.choose({"float32": 400.0, "mixed_bfloat16": 300.0})[0] == "float32"
    assert ap.choose({"float32": 400.0, "mixed_bfloat16": 400.0})[0] == "float32"  # a tie
    # Within the margin float32 stays: the probe is short and float32 is the safer numerics.
    assert ap.choose({"float32": 400.0, "mixed_bfloat16": 400.0 * (1 + ap.MARGIN)})[0] == "float32"
    assert (
        ap.choose({"float32": 400.0, "mixed_bfloat16": 400.0 * (1 + ap.MARGIN) + 1})[0]
        == "mixed_bfloat16"
    )
    # With a GPU the fastest of the mixed policies competes.
    rates = {"float32": 100.0, "mixed_bfloat16": 150.0, "mixed_float16": 300.0}
    assert ap.choose(rates)[0] == "mixed_float16"
    assert ap.candidates(gpu=False) == ("float32", "mixed_bfloat16")
    assert ap.candidates(gpu=True) == ("float32", "mixed_bfloat16", "mixed_float16")


class FakeClock:
    """A clock that only the fake steps move: each policy's execution takes a known time."""

    def __init__(self):
        self.now = 0.0
        self.calls = []

    def __call__(self):
        return self.now

    def step(self, policy, seconds):
        def run():
            self.calls.append(policy)
            self.now += seconds.pop(0) if isinstance(seconds, list) else seconds

        return run


def test_measure_times_every_policy_in_turns_after_the_warm_up():
    clock = FakeClock()
    steps = {
        "float32": clock.step("float32", 0.5),
        "mixed_bfloat16": clock.step("mixed_bfloat16", 0.375),
    }
    seconds, medians = ap.measure(
        steps, warmup=2, min_rounds=3, max_rounds=5, enough_seconds=100, timer=clock
    )
    assert seconds == {
        "float32": [0.5] * 5,
        "mixed_bfloat16": [0.375] * 5,
    }  # no early stop: max_rounds
    assert medians == {"float32": 0.5, "mixed_bfloat16": 0.375}
    # 2 warm-up rounds, then timed rounds whose order rotates (a load burst hits both alike)
    assert clock.calls[:7] == ["float32", "mixed_bfloat16"] * 2 + [
        "float32",
        "mixed_bfloat16",
        "mixed_bfloat16",
    ]
    assert clock.calls[7:10] == ["float32", "float32", "mixed_bfloat16"]


def test_measure_stops_once_the_answer_is_clear_or_long_enough():
    def rounds(f32, bf16, **kw):
        clock = FakeClock()
        steps = {
            "float32": clock.step("float32", f32),
            "mixed_bfloat16": clock.step("mixed_bfloat16", bf16),
        }
        seconds, _ = ap.measure(steps, warmup=1, timer=clock, **kw)
        return len(seconds["float32"])

    # bf16 4x slower (as without bf16 hardware): two timed steps each are enough
    assert rounds(0.25, 1.0) == 2
    # close: at least MIN_ROUNDS, then until the timed steps add up to ENOUGH_SECONDS
    assert rounds(0.5, 0.625) == ap.MIN_ROUNDS  # 3 rounds = 3.375 s >= 3 s
    assert rounds(0.125, 0.125) == 12  # 12 rounds x 0.25 s = 3 s
    assert rounds(0.001, 0.001) == ap.MAX_ROUNDS  # a tiny model: never 3 s, capped


def test_the_decision_uses_median_times_and_says_why():
    clock = FakeClock()
    # float32: 0.25 s per step with one outlier; bf16: 0.375 s; the warm-up steps slower
    steps = {
        "float32": clock.step("float32", [1.0, 0.25, 4.0, 0.25, 0.25, 0.25]),
        "mixed_bfloat16": clock.step("mixed_bfloat16", [2.0, 0.375, 0.375, 0.375, 0.375, 0.375]),
    }
    seconds, medians = ap.measure(
        steps, warmup=1, max_rounds=4, enough_seconds=100, clear_ratio=100, timer=clock
    )
    assert seconds["float32"] == [0.25, 4.0, 0.25, 0.25]
    policy, reason, rates = ap.decide(medians, examples_per_step=96)
    assert rates == {
        "float32": 384.0,
        "mixed_bfloat16": 256.0,
    }  # from the medians; the outlier ignored
    assert policy == "float32"
    probe = ap.Probe(policy, reason, rates)
    assert probe.log_line() == (
        "precision auto: float32 384 ex/s, mixed_bfloat16 256 ex/s -> float32 "
        "(mixed_bfloat16 is 0.67x float32, not above 1.05x)"
    )
    assert probe.to_dict()["requested"] == "auto" and probe.to_dict()["policy"] == "float32"


def test_workers_stop_and_decide_from_the_same_averaged_numbers():
    # This worker sees bf16 faster; the other worker's medians (and time spent) say it is much slower.
    other = [1.0, 2.0, 20.0]

    def mean(values):  # what the all-reduce returns on every worker
        return [(a + b) / 2 for a, b in zip(values, other)]

    clock = FakeClock()
    steps = {
        "float32": clock.step("float32", 1.0),
        "mixed_bfloat16": clock.step("mixed_bfloat16", 0.75),
    }
    alone_seconds, alone = ap.measure(steps, warmup=0, enough_seconds=10, max_rounds=4, timer=clock)
    assert ap.decide(alone, 100)[0] == "mixed_bfloat16" and len(alone_seconds["float32"]) == 4
    clock = FakeClock()
    steps = {
        "float32": clock.step("float32", 1.0),
        "mixed_bfloat16": clock.step("mixed_bfloat16", 0.75),
    }
    seconds, agreed = ap.measure(
        steps, warmup=0, enough_seconds=10, max_rounds=4, timer=clock, agree=mean
    )
    assert agreed == {"float32": 1.0, "mixed_bfloat16": 1.375}
    assert (
        len(seconds["float32"]) == 3
    )  # the agreed time spent, (5.25 + 20) / 2, ended it after round 3
    assert ap.decide(agreed, 100)[0] == "float32"


# -- the warning ---------------------------------------------------------------------------------


def test_cpu_flags_are_parsed_from_cpuinfo_text():
    assert {"avx2", "fma"} <= cpu_flags(X86_NO_BF16) and "avx512_bf16" not in cpu_flags(X86_NO_BF16)
    assert "avx512_bf16" in cpu_flags(X86_AVX512_BF16)
    assert "amx_bf16" in cpu_flags(X86_AMX)
    assert "bf16" in cpu_flags(ARM)
    assert cpu_flags("") == set()
    two_blocks = (
        X86_AMX.replace("processor", "\nprocessor", 1) + "\nprocessor\t: 9\nflags\t\t: only_later\n"
    )
    assert parse_cpuinfo(X86_NO_BF16)["model"] == "AMD EPYC 7B13"
    assert "only_later" not in parse_cpuinfo(two_blocks)["flags"]  # the first processor's block
    # this machine: what lscpu or /proc/cpuinfo says, flags sorted, the same set cpu_flags reads
    info = cpu_info()
    assert (
        info["model"]
        and info["flags"] == sorted(info["flags"])
        and info["source"] in ("lscpu", "/proc/cpuinfo")
    )
    assert set(info["flags"]) == cpu_flags()


def test_mixed_bfloat16_warns_only_without_bf16_hardware():
    warning = precision.bf16_warning("mixed_bfloat16", cpu_flags(X86_NO_BF16), [])
    assert warning and "\n" not in warning
    assert (
        "slower than float32" in warning and "--precision auto" in warning and "float32" in warning
    )
    assert precision.bf16_warning("mixed_bfloat16", cpu_flags(X86_AVX512_BF16), []) is None
    assert precision.bf16_warning("mixed_bfloat16", cpu_flags(X86_AMX), []) is None
    assert precision.bf16_warning("mixed_bfloat16", cpu_flags(X86_NO_BF16), ["GPU"]) is None
    assert precision.bf16_warning("mixed_bfloat16", cpu_flags(X86_NO_BF16), ["TPU"]) is None
    for other in ("float32", "mixed_float16", "auto"):
        assert precision.bf16_warning(other, cpu_flags(X86_NO_BF16), []) is None


def test_the_warning_is_printed_once_per_process(capsys):
    from tfopt.core import log

    expected = precision.bf16_warning("mixed_bfloat16", cpu_flags(), precision.accelerators())
    precision._warned.clear()
    log.configure("tfopt distill")  # the warning names the stage that warns, not the command
    for _ in range(3):
        precision.warn_without_bf16_hardware("mixed_bfloat16", "tfopt train")
    err = capsys.readouterr().err
    if expected is None:  # this machine has bf16 hardware
        assert err == ""
    else:
        assert err == f"tfopt train: warning: {expected}\n"


# -- config and CLI --------------------------------------------------------------------------------


def test_auto_is_a_valid_precision_and_a_bad_one_lists_the_choices(capsys):
    assert C.from_dict({"runtime": {"precision": "auto"}}).runtime.precision == "auto"
    with pytest.raises(
        ConfigError,
        match=r"^runtime.precision='fp8' is not valid; choose one of float32, "
        r"mixed_float16, mixed_bfloat16, auto$",
    ):
        C.from_dict({"runtime": {"precision": "fp8"}})
    from tfopt.train.cli import main

    assert main(["--precision", "fp8", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "choose one of float32, mixed_float16, mixed_bfloat16, auto" in err
    )
    assert main(["--precision", "auto", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["runtime"]["precision"] == "auto"
    with pytest.raises(ValueError, match="not a Keras policy"):
        precision.set_policy("auto")


# -- a real run ----------------------------------------------------------------------------------


def _cfg(out, precision_name):
    return C.from_dict(
        {
            "data": {"dataset": "digits", "global_batch_size": 64, "num_shards": 2},
            "model": {"name": "tiny_cnn", "dropout": 0.25},
            "runtime": {"strategy": "mirrored", "precision": precision_name, "deterministic": True},
            "train": {"epochs": 1, "output_dir": str(out), "verbose": 0, "tensorboard": False},
        }
    )


@pytest.mark.slow
def test_auto_records_the_probe_and_trains_like_the_policy_it_chose(tmp_path, capfd):
    from tfopt.core._keras import keras

    from tfopt.core import log
    from tfopt.train import run as train

    log.configure("tfopt")  # as the command line does; the line names its stage
    record = train(_cfg(tmp_path / "auto", "auto"))
    err = capfd.readouterr().err
    run = json.loads((tmp_path / "auto" / "run.json").read_text())
    probe = run["strategy"]["precision_auto"]
    chosen = run["strategy"]["precision"]
    assert keras.mixed_precision.global_policy().name == "float32"  # restored after the job
    assert probe["requested"] == "auto" and probe["policy"] == chosen in (
        "float32",
        "mixed_bfloat16",
    )
    assert run["config"]["runtime"]["precision"] == chosen
    assert list(probe["examples_per_sec"]) == ["float32", "mixed_bfloat16"]
    assert (
        probe["global_batch_size"] == 64
        and probe["seconds"] > 0
        and probe["warmup_steps"] == ap.WARMUP_STEPS
    )
    rounds = {len(v) for v in probe["step_seconds"].values()}
    assert len(rounds) == 1 and 2 <= rounds.pop() <= ap.MAX_ROUNDS
    assert probe["workers"] == 1
    # the rates follow from the recorded times, and the decision from the rates
    for policy, seconds in probe["step_seconds"].items():
        assert probe["examples_per_sec"][policy] == pytest.approx(
            64 / statistics.median(seconds), rel=1e-3
        )
    assert ap.choose(probe["examples_per_sec"]) == (chosen, probe["reason"])
    line = ap.Probe(chosen, probe["reason"], probe["examples_per_sec"]).log_line()
    assert f"tfopt train: {line}\n" in err
    # The probe left no trace in the run: the same weights as a run of the chosen policy.
    explicit = train(_cfg(tmp_path / "explicit", chosen))
    assert record.weights_sha256 == explicit.weights_sha256
    assert record.history[0]["loss"] == explicit.history[0]["loss"]
    assert os.path.isfile(tmp_path / "auto" / "model.keras")


def _launch(tmp_path, *launch_args, strategy):
    from isolation import ISOLATED

    out = tmp_path / "run"
    cmd = [
        *ISOLATED,
        sys.executable,
        "-m",
        "tfopt.launch",
        *launch_args,
        "--timeout",
        "240",
        "--",
        sys.executable,
        "-m",
        "tfopt.train",
        "--strategy",
        strategy,
        "--precision",
        "auto",
        "--dataset",
        "digits",
        "--model",
        "tiny_cnn",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "4",
        "--batch-size",
        "32",
        "--quiet",
        "-o",
        str(out),
        "--set",
        "data.num_shards=2",
        "--set",
        "train.tensorboard=false",
    ]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    lines = {}
    for line in text.splitlines():
        if "tfopt train: precision auto: " in line:
            task, _, rest = line.partition("] ")
            lines[task.lstrip("[")] = rest
    return json.loads((out / "run.json").read_text()), lines


@pytest.mark.slow
def test_auto_under_multi_worker_mirrored_every_worker_decides_alike(tmp_path):
    run, lines = _launch(tmp_path, "--workers", "2", strategy="multi_worker_mirrored")
    probe = run["strategy"]["precision_auto"]
    assert sorted(lines) == ["worker:0", "worker:1"], lines
    # each worker timed its own steps, then both decided from the all-reduced mean: one line
    assert lines["worker:0"] == lines["worker:1"]
    assert probe["workers"] == 2 and probe["policy"] == run["strategy"]["precision"]
    assert lines["worker:0"].endswith(
        ap.Probe(probe["policy"], probe["reason"], probe["examples_per_sec"]).log_line()
    )


@pytest.mark.slow
def test_auto_under_parameter_servers_the_chief_decides(tmp_path):
    run, lines = _launch(
        tmp_path, "--chief", "--workers", "1", "--ps", "1", strategy="parameter_server"
    )
    probe = run["strategy"]["precision_auto"]
    assert sorted(lines) == ["chief:0"], lines  # workers and parameter servers only serve
    assert probe["workers"] == 1 and probe["policy"] == run["strategy"]["precision"]
    assert set(probe["examples_per_sec"]) == {"float32", "mixed_bfloat16"}
