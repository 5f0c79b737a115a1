"""README.md and the guides can be followed as written: every command of their ``bash`` blocks runs, in order.

README.md's first block (the two set-up commands that create ``.venv``) is what ``.ci/run`` itself
runs. Every later command, README.md's then each guide's in the order of ``DOCS``, belongs to the
document that shows it first (a command a guide repeats from an earlier document runs once). Each
document's commands run as one chain in a fresh directory, after the earlier commands whose run
directories they read (found from the paths they name: ``-o``, ``--from``, ``--teacher``, ...), so
the chains are independent and run in parallel, each in the order the documents give. A command
that several chains run after the same commands (the README's main job, which most guides read)
runs once per session: the first chain to reach it runs it, the others copy its outputs. The pipelines' commands (``tfopt.pipeline``,
``tfopt.report``) make and read only their own run directories, so they run in a directory of
their own (``test_readme_pipelines.py``, beside this test under pytest-xdist). Blocks marked
``text`` show commands that need what a test machine lacks (your files, docker, kubectl); the
phone of docs/export.md is the stand-in ``adb`` of ``tests/fake_adb``.
Work is kept small by adding flags right after the command's name (the command's own flags come
later and win), and by lowering a documented ``--epochs`` (or ``--rounds``) to at most ``EPOCHS``: ``--limit`` for
the training-like stages (``TFOPT_README_LIMIT`` records per split, default 512), the smoke
variant for the pipelines (under their default strategy) and fewer evaluation examples and timing
runs for the export.
"""

import glob
import os
import re
import shlex
import subprocess
import sys
import time

import pytest
from isolation import ISOLATED

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT = os.environ.get("TFOPT_README_LIMIT", "512")
SMALL = {
    "tfopt.train": ["--limit", LIMIT, "--quiet"],
    "tfopt.distill": ["--limit", LIMIT, "--quiet"],
    "tfopt.optimize": ["--limit", LIMIT, "--quiet"],
    "tfopt.federated": ["--limit", LIMIT, "--quiet"],
    # The pipelines' default strategy (the smoke variant's own is one_device): so the README's
    # second pipeline command, which names it, finds every stage finished, as it says.
    "tfopt.pipeline": ["--variant", "smoke", "--strategy", "mirrored", "--quiet"],
    # The slice's models train a dozen steps (near chance): int8 flips many of their near-tied
    # top-1 answers, so the fidelity gate (tested on trained models in test_export) is loosened.
    "tfopt.export": [
        "--eval-limit",
        "300",
        "--runs",
        "10",
        "--warmup",
        "2",
        "--calibration-steps",
        "2",
        "--search-limit",
        "300",
        "--min-agreement",
        "0.9",
        "--max-accuracy-drop",
        "10",
        "--no-keras-latency",
        "--quiet",
    ],
}


# The documents whose bash blocks run, in this order (README.md first, then the guides).
DOCS = (
    "README.md",
    "docs/training.md",
    "docs/privacy.md",
    "docs/federated.md",
    "docs/data.md",
    "docs/fault_tolerance.md",
    "docs/scaling.md",
    "docs/distillation.md",
    "docs/compression.md",
    "docs/structured.md",
    "docs/export.md",
    "docs/your_model.md",
    "docs/data_service.md",
    "docs/kubernetes.md",
    "docs/pipelines.md",
    "pipelines/README.md",
)
PIPELINE_COMMAND = re.compile(r"-m tfopt\.(pipeline|report)\b")


def doc_commands(text: str, skip_first: bool = False) -> list[str]:
    """The commands of a document's ``bash`` blocks, comments removed, continuations joined."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S)[(1 if skip_first else 0) :]:
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def main_job(text: str) -> str:
    """The main job of README's first set-up command (what follows its last ``&&``), as the tour
    runs it with the venv active: the run directory it writes is where the tour starts."""
    first = doc_commands(text)[0]
    return first.rsplit("&&", 1)[1].strip().replace(".venv/bin/python", "python", 1)


def all_commands() -> list[str]:
    """Every command of ``DOCS`` in order: README's main job, then every command after its set-up block."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        out = [main_job(f.read())]
    for doc in DOCS:
        with open(os.path.join(REPO, doc), encoding="utf-8") as f:
            out.extend(doc_commands(f.read(), skip_first=doc == "README.md"))
    return out


def section_commands(pipelines: bool) -> list[str]:
    """The pipelines' commands (True) or every other command (False), in order, each once."""
    out = []
    for command in all_commands():
        if bool(PIPELINE_COMMAND.search(command)) == pipelines and command not in out:
            out.append(command)
    return out


#: README cluster launches a dedicated test already runs (the same launcher flags, stage and
#: strategy), keyed by ``launch_key``: the chains parse them instead of running them again.
COVERED_LAUNCHES = {
    (("--max-restarts", "--workers"), "tfopt.train", "multi_worker_mirrored"): (
        "test_fault_tolerance.py",
        "test_multi_worker_kills_of_a_worker_and_the_chief_restart_to_identical_weights",
    ),
    (("--chief", "--ps", "--workers"), "tfopt.train", "parameter_server"): (
        "test_sharding.py",
        "test_sharded_parameter_servers_resume_across_shardings_bit_identically",
    ),
    (("--workers",), "tfopt.optimize", "multi_worker_mirrored"): (
        "test_optimize_matrix.py",
        "test_matrix_matches_compatibility_doc",
    ),
    (("--data-workers", "--workers"), "tfopt.train", "multi_worker_mirrored"): (
        "test_launch_data_service.py",
        "test_training_goes_on_when_its_data_worker_and_dispatcher_are_killed",
    ),
}


#: README runs of one process a dedicated test already makes with the same option (stage, flag,
#: value): the chains parse them instead of running them again.
COVERED_RUNS = {
    ("tfopt.federated", "--engine", "simulation"): (
        "test_federated.py",
        "test_the_simulation_engine_runs_the_clients_in_the_superlink_and_computes_the_same_fedavg",
    ),
    ("tfopt.federated", "--client-runtime", "litert"): (
        "test_federated.py",
        "test_litert_clients_train_the_head_in_the_tflite_signature_as_fedavg_computed_here",
    ),
}


def run_key(command: str) -> tuple | None:
    """``(stage, flag, value)`` of a command that a ``COVERED_RUNS`` entry names."""
    words = shlex.split(command)
    if "-m" not in words or "tfopt.launch" in words:
        return None
    stage = words[words.index("-m") + 1]
    for key in COVERED_RUNS:
        if key[0] == stage and key[1] in words and words[words.index(key[1]) + 1] == key[2]:
            return key
    return None


def launch_key(command: str) -> tuple | None:
    """``(launcher flags, stage, strategy)`` of a ``tfopt.launch`` command that runs a cluster."""
    words = shlex.split(command)
    if "tfopt.launch" not in words or "--" not in words or "--render" in words:
        return None
    split = words.index("--")
    own = tuple(sorted(w for w in words[:split] if w.startswith("--")))
    inner = words[split + 1 :]
    stage = inner[inner.index("-m") + 1]
    strategy = inner[inner.index("--strategy") + 1] if "--strategy" in inner else None
    return own, stage, strategy


def _covered(command: str) -> bool:
    return launch_key(command) in COVERED_LAUNCHES or run_key(command) is not None


def _outputs(command: str) -> set[str]:
    """The paths a command writes: ``-o``/``--output``, the folder ``to_folder`` makes, a
    ``--config`` file's ``train.output_dir``, or the stage's default next to its input."""
    words = shlex.split(command)
    out: set[str] = set()
    if "--print-config" in words:
        return out
    for flag in ("-o", "--output"):
        if flag in words:
            out.add(words[words.index(flag) + 1])
    if "tfopt.data.to_folder" in words:
        rest = [
            w for w in words[words.index("tfopt.data.to_folder") + 1 :] if not w.startswith("-")
        ]
        out.add(rest[1])
    if not out and "tfopt.train" in words and "--config" in words:
        from tfopt import config as config_lib

        cfg = config_lib.load(os.path.join(REPO, words[words.index("--config") + 1]))
        out.add(cfg.train.output_dir)
    if not out and "--from" in words and "--inspect" not in words:
        source = words[words.index("--from") + 1]
        if "tfopt.export" in words:
            out.add(f"{source}-export")
        elif "--technique" in words:
            out.add(f"{source}-{words[words.index('--technique') + 1]}")
    return out


def _reads(command: str, path: str) -> bool:
    """True when a word of ``command`` names ``path`` or a file under it."""
    for word in shlex.split(command):
        word = word.removeprefix("folder:")
        if word == path or word.startswith(path.rstrip("/") + "/"):
            return True
    return False


def chains(commands: list[str] | None = None) -> dict[str, list[str]]:
    """Document -> its commands, each after the earlier commands it reads from (in the
    documents' order); documents without commands of their own are left out."""
    commands = section_commands(pipelines=False) if commands is None else commands
    owner = {}
    for doc in DOCS:
        with open(os.path.join(REPO, doc), encoding="utf-8") as f:
            text = f.read()
        mine = [main_job(text)] if doc == "README.md" else []
        for command in mine + doc_commands(text, skip_first=doc == "README.md"):
            owner.setdefault(command, doc)
    needs: dict[int, set[int]] = {}
    for i, command in enumerate(commands):
        needs[i] = set()
        written: dict[str, int] = {}  # path -> the last earlier command that writes it
        for j in range(i):
            for path in _outputs(commands[j]):
                written[path] = j
        needs[i] = {j for path, j in written.items() if _reads(command, path)}

    def with_needs(i: int) -> set[int]:
        out = {i}
        for j in needs[i]:
            out |= with_needs(j)
        return out

    read = set().union(*needs.values())  # a covered launch whose run another command reads runs
    by_doc: dict[str, set[int]] = {}
    for i, command in enumerate(commands):
        if _covered(command) and i not in read:
            continue
        by_doc.setdefault(owner.get(command, "README.md"), set()).update(with_needs(i))
    return {doc: [commands[i] for i in sorted(by_doc[doc])] for doc in DOCS if doc in by_doc}


def _export_small(args: list[str]) -> list[str]:
    """SMALL's export flags that the command's modes read (export refuses a flag nothing reads)."""
    from tfopt.export.choices import DEFAULT_MODES
    from tfopt.export.cli import FLAG_USERS

    modes = (
        set(args[args.index("--modes") + 1].split(",")) if "--modes" in args else set(DEFAULT_MODES)
    )
    small, out = SMALL["tfopt.export"], []
    for j, flag in enumerate(small):
        if not flag.startswith("--"):
            continue
        if "--from" in FLAG_USERS.get(flag, ("--from",)) or modes & set(FLAG_USERS[flag]):
            value = (
                small[j + 1 : j + 2]
                if j + 1 < len(small) and not small[j + 1].startswith("--")
                else []
            )
            out += [flag, *value]
    return out


#: Words of a documented command that the shell reads (a redirect of the output, a pipe).
SHELL_OPERATORS = (">", ">>", "|", "&&", "2>&1")


#: The most epochs (or federated rounds) a command of the small slice trains (a documented
#: ``--epochs N`` above it is lowered to it): the slice checks that a command runs as written, not
#: what N epochs reach.
EPOCHS = 2
#: The flags ``EPOCHS`` caps.
CAPPED = ("--epochs", "--rounds", "--local-epochs")


def shrink(command: str) -> str:
    """``command`` with the small-slice flags added after every ``python -m tfopt.X`` and its
    ``CAPPED`` flags at most ``EPOCHS``."""
    words = shlex.split(command)
    out = []
    for i, word in enumerate(words):
        if i >= 1 and words[i - 1] in CAPPED and int(word) > EPOCHS:
            word = str(EPOCHS)
        out.append(word)
        if i >= 1 and words[i - 1] == "-m" and word in SMALL:
            if word == "tfopt.export" and "--from" not in words[i + 1 :]:
                continue  # --evaluate / --benchmark take their own flags
            if word == "tfopt.export":
                out.extend(_export_small(words[i + 1 :]))
                continue
            if word == "tfopt.optimize" and "--inspect" in words[i + 1 :]:
                continue
            out.extend(SMALL[word])
    return " ".join(w if w in SHELL_OPERATORS else shlex.quote(w) for w in out)


def test_readme_commands_are_extracted():
    commands = all_commands()
    assert len(commands) >= 30 and all("tfopt" in c for c in commands), commands
    assert sorted(set(section_commands(True) + section_commands(False))) == sorted(set(commands))
    assert not any(PIPELINE_COMMAND.search(c) for c in section_commands(False))
    assert doc_commands("```bash\na \\\n  b  # note\n# c\n```\n```text\nd\n```\n") == ["a    b"]
    # The tour starts from the run the first set-up command trained.
    assert commands[0].startswith("python -m tfopt.train ") and "-o runs/mnist" in commands[0]
    assert any("--from runs/mnist " in c for c in commands[1:8])
    assert shrink("python -m tfopt.launch --workers 2 -- python -m tfopt.train -o r").endswith(
        f"python -m tfopt.train --limit {LIMIT} --quiet -o r"
    )
    assert shrink("python -m tfopt.train --epochs 10 -o r").endswith("--epochs 2 -o r")
    assert shrink("python -m tfopt.train --epochs 1 -o r").endswith("--epochs 1 -o r")
    assert shrink("python -m tfopt.federated --rounds 3 --local-epochs 2").endswith(
        "--rounds 2 --local-epochs 2"
    )


def test_every_document_with_commands_is_run():
    """A guide with a bash block that ``DOCS`` leaves out would show commands no test runs."""
    docs = [
        os.path.relpath(p, REPO)
        for pattern in ("*.md", "docs/*.md", "pipelines/*.md", "notebooks/*.md")
        for p in glob.glob(os.path.join(REPO, pattern))
    ]
    with_bash = {
        d for d in docs if "```bash" in open(os.path.join(REPO, d), encoding="utf-8").read()
    }
    assert with_bash <= set(DOCS), sorted(with_bash - set(DOCS))


def closure_keys(commands: list[str]) -> list[tuple[str, ...]]:
    """For each command of a chain, the commands whose outputs it reads, directly or not, then
    itself, in the chain's order: what its run depends on (the last earlier writer of each path)."""
    closures: list[set[int]] = []
    for k, command in enumerate(commands):
        written = {path: j for j in range(k) for path in _outputs(commands[j])}
        needs = {j for path, j in written.items() if _reads(command, path)}
        closures.append(needs.union(*(closures[j] for j in needs)))
    return [
        tuple(commands[j] for j in sorted(closure)) + (command,)
        for closure, command in zip(closures, commands)
    ]


def shared_keys() -> set[tuple[str, ...]]:
    """The dependency keys (:func:`closure_keys`) that more than one chain holds, of commands whose
    whole effect is their outputs: a chain copies such a run from the chain that ran it first."""
    seen: dict[tuple[str, ...], int] = {}
    for commands in chains().values():
        for key in set(closure_keys(commands)):
            seen[key] = seen.get(key, 0) + 1
    return {
        key
        for key, count in seen.items()
        if count > 1
        and _outputs(key[-1])
        and not {"--device", "tfopt.launch"} & set(shlex.split(key[-1]))
    }


def _copy_outputs(paths, src, dst) -> None:
    """Copies each of ``paths`` (relative) from ``src`` to ``dst``, replacing what is there."""
    import shutil

    for path in paths:
        source, target = os.path.join(src, path), os.path.join(dst, path)
        if os.path.isdir(target):
            shutil.rmtree(target)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.isdir(source):
            shutil.copytree(source, target, symlinks=True)
        else:
            shutil.copy2(source, target)


def run_in_order(commands: list[str], tmp_path, after=None, share=None) -> None:
    """Runs ``commands`` (shrunk to the small slice) one after another in ``tmp_path``; fails on the first error.

    ``after(i, command)``, if given, is called after command ``i`` (1-based) succeeded.
    ``share(key, make)``, if given, runs ``make(directory)`` once per test session for the
    dependency ``key`` of a command that other chains run too (:func:`shared_keys`): the first
    chain runs the command and keeps its outputs there, the others copy them.
    """
    os.symlink(os.path.join(REPO, "pipelines"), tmp_path / "pipelines")
    bin_dir = os.path.dirname(sys.executable)
    # docs/export.md's phone: the stand-in adb (tests/fake_adb) and a benchmark_model to push
    phone = tmp_path / ".phone"
    phone.mkdir()
    (tmp_path / "android_aarch64_benchmark_model").write_bytes(b"\x7fELF benchmark_model")
    env = dict(
        os.environ,
        PATH=os.pathsep.join(
            [os.path.join(REPO, "tests", "fake_adb"), bin_dir, os.environ["PATH"]]
        ),
        PYTHONUNBUFFERED="1",
        FAKE_ADB_ROOT=str(phone),
        FAKE_ADB_REPLAY=os.path.join(REPO, "tests", "data", "benchmark_model_arm64.txt"),
    )
    keys, shared = closure_keys(commands), shared_keys() if share else set()
    for i, command in enumerate(commands, 1):
        if keys[i - 1] in shared:
            outputs = sorted(_outputs(command))
            ran = []

            def make(directory, command=command, outputs=outputs, i=i):
                _run_one(command, i, len(commands), tmp_path, env)
                _copy_outputs(outputs, tmp_path, directory)
                ran.append(True)
                return directory

            directory = share(keys[i - 1], make)
            if not ran:
                _copy_outputs(outputs, directory, tmp_path)
                print(
                    f"[{i}/{len(commands)}] copied from the chain that ran it: {command}",
                    flush=True,
                )
        else:
            _run_one(command, i, len(commands), tmp_path, env)
        if after is not None:
            after(i, command)


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_one(command: str, i: int, n: int, tmp_path, env: dict) -> None:
    """Runs one command of a chain (shrunk) in ``tmp_path``; fails the test on a non-zero exit."""
    small = shrink(command)
    # Commands that start TensorFlow servers run in a private network namespace where possible.
    prefix = ISOLATED if "tfopt.launch" in small else []
    started, cpu = time.monotonic(), _children_cpu()
    proc = subprocess.run(
        [*prefix, "bash", "-c", small],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(
        f"[{i}/{n}] exit {proc.returncode} in {time.monotonic() - started:.0f} s "
        f"({_children_cpu() - cpu:.0f} CPU s): {command}",
        flush=True,
    )
    assert proc.returncode == 0, (
        f"README command {i} failed: {command}\nran: {small}\n"
        + proc.stdout[-3000:]
        + proc.stderr[-3000:]
    )


def test_a_command_that_several_chains_run_is_keyed_by_what_it_reads():
    train_a, train_b = "python -m tfopt.train -o runs/a", "python -m tfopt.train -o runs/b"
    prune = "python -m tfopt.optimize --from runs/a --technique prune"
    export = "python -m tfopt.export --from runs/a-prune"
    assert closure_keys([train_a, train_b, prune, export]) == [
        (train_a,),
        (train_b,),
        (train_a, prune),
        (train_a, prune, export),
    ]
    shared = shared_keys()  # the README's main job, at least, is read by several guides' chains
    assert any(key[-1].startswith("python -m tfopt.train ") for key in shared), shared
    assert all(_outputs(key[-1]) for key in shared)


def test_every_command_is_in_a_chain_after_what_it_reads():
    commands = section_commands(pipelines=False)
    found = chains(commands)
    assert set().union(*map(set, found.values())) == {c for c in commands if not _covered(c)}
    for doc, chain in found.items():
        assert chain == sorted(chain, key=commands.index), doc  # the documents' order
    # the tour's export reads the main job's run; the photos' model reads the photos
    tour = found["README.md"]
    assert tour.index(commands[0]) < tour.index(
        next(c for c in tour if "--from runs/mnist --modes" in c)
    )
    distill = found["docs/distillation.md"]
    assert any("mnist_cnn.yaml --precision" in c for c in distill)  # the second teacher's run
    assert not any("--print-config" in c for c in distill)
    assert any(
        c.startswith("python -m tfopt.train --strategy mirrored -o runs/mnist") for c in distill
    )
    export = found["docs/export.md"]
    assert any("--technique pqat" in c for c in export)  # export.md's --from runs/mnist-pqat
    assert not any("fashion_mlp" in c for c in export)
    assert _outputs("python -m tfopt.optimize --from runs/mnist --technique pqat") == {
        "runs/mnist-pqat"
    }
    assert _outputs("python -m tfopt.export --from runs/a --modes int8") == {"runs/a-export"}
    assert _outputs("python -m tfopt.data.to_folder fashion_mnist photos --limit 600") == {"photos"}


def test_a_launch_a_dedicated_test_runs_is_parsed_and_that_test_runs_the_same_launch():
    """The README's cluster launches that a chain does not run: each parses (launcher and stage),
    and the dedicated test named for it launches the same flags, stage and strategy."""
    import ast
    import importlib

    from tfopt.config import cli
    from tfopt.launch.cli import build_parser as launch_parser

    covered = [c for c in section_commands(pipelines=False) if launch_key(c) in COVERED_LAUNCHES]
    assert len(covered) == len(COVERED_LAUNCHES), covered  # each entry is still in the docs
    for command in covered:
        words = shlex.split(command)
        split = words.index("--")
        launch_parser().parse_args(words[words.index("tfopt.launch") + 1 : split])
        inner = words[split + 1 :]
        stage = inner[inner.index("-m") + 1]
        parser = importlib.import_module(f"{stage}.cli").build_parser()
        args = parser.parse_args(inner[inner.index("-m") + 2 :])
        if stage == "tfopt.train":
            cli.config_from_args(args)  # the flags' values are valid, as at the start of a run
        own, _, strategy = launch_key(command)
        file, name = COVERED_LAUNCHES[launch_key(command)]
        with open(os.path.join(REPO, "tests", file), encoding="utf-8") as f:
            source = f.read()
        tests = {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
        assert name in tests, (file, name)
        for needed in (*own, stage, strategy):
            assert f'"{needed}"' in source or f"{needed} " in source, (command, file, needed)
    runs = [c for c in section_commands(pipelines=False) if run_key(c)]
    assert sorted(map(run_key, runs)) == sorted(COVERED_RUNS), runs  # each is still in the docs
    for command in runs:
        words = shlex.split(command)
        stage = words[words.index("-m") + 1]
        parser = importlib.import_module(f"{stage}.cli").build_parser()
        cli.config_from_args(parser.parse_args(words[words.index("-m") + 2 :]))
        file, name = COVERED_RUNS[run_key(command)]
        with open(os.path.join(REPO, "tests", file), encoding="utf-8") as f:
            source = f.read()
        assert name in {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
        test = source[source.index(f"def {name}(") :].split("\ndef ", 1)[0]
        _, flag, value = run_key(command)
        assert re.search(rf'"{flag}",\s*"{value}"', test), (command, file, name)
    # the key reads the launcher's own flags, the stage and the strategy
    assert launch_key(
        "python -m tfopt.launch --workers 2 --max-restarts 3 -- python -m tfopt.train "
        "--strategy multi_worker_mirrored -o r"
    ) == (("--max-restarts", "--workers"), "tfopt.train", "multi_worker_mirrored")
    assert launch_key("python -m tfopt.train -o r") is None


@pytest.mark.slow
@pytest.mark.parametrize("doc", sorted(chains()))
def test_every_command_runs_in_order(doc, tmp_path, tmp_path_factory):
    import hashlib

    from conftest import once_per_session

    def share(key, make):
        digest = hashlib.sha256("\n".join(key).encode()).hexdigest()[:16]
        return once_per_session(tmp_path_factory, f"readme-{digest}", make)

    run_in_order(chains()[doc], tmp_path, share=share)
