"""Federated training (tfopt.federated): partitions, local training, refusals, and runs through
real Flower processes (a SuperLink and SuperNodes), killed and resumed."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tfopt import config as C
from tfopt.core.errors import ConfigError
from tfopt.federated import partition as P
from tfopt.federated.cli import main

HERE = os.path.dirname(__file__)


def _fed(**kw):
    return C.from_dict({"federated": kw}).federated


def _labels(per_class=60, classes=10, seed=0):
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(classes), per_class))


@pytest.mark.parametrize(
    "how,extra",
    [("iid", {}), ("shards", {"shards_per_client": 2}), ("dirichlet", {"dirichlet_alpha": 0.3})],
)
@pytest.mark.parametrize("clients", [1, 3, 7])
def test_every_example_goes_to_exactly_one_client(how, extra, clients):
    labels = _labels()
    parts = P.partition(labels, _fed(clients=clients, partition=how, **extra), seed=5)
    assert len(parts) == clients and all(len(p) for p in parts)
    joined = np.concatenate(parts)
    assert sorted(joined.tolist()) == list(range(len(labels)))
    again = P.partition(labels, _fed(clients=clients, partition=how, **extra), seed=5)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_iid_parts_differ_by_at_most_one_and_mix_the_classes():
    parts = P.iid(601, 4, seed=1)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    table = P.describe(P.partition(_labels(), _fed(clients=4), seed=1), _labels(), 10)
    assert table["classes_per_client"] == 10


def test_shards_give_each_client_its_shards_classes_as_mcmahan_et_al():
    # 100 clients x 2 shards of 300 over 60,000 label-sorted examples: at most 2 classes each
    labels = _labels(per_class=6000)
    parts = P.shards(labels, 100, 2, seed=3)
    classes = [len(np.unique(labels[p])) for p in parts]
    assert max(classes) <= 2 and {len(p) for p in parts} == {600}
    assert np.mean(classes) > 1.5  # shards are dealt at random, not two of a class in a row


def test_a_smaller_dirichlet_alpha_gives_each_client_fewer_classes():
    labels = _labels(per_class=200)
    seen = {
        alpha: P.describe(P.dirichlet(labels, 10, alpha, seed=2), labels, 10)["classes_per_client"]
        for alpha in (0.05, 100.0)
    }
    assert seen[0.05] < 5 and seen[100.0] == 10, seen


def test_impossible_partitions_are_one_line():
    with pytest.raises(ConfigError, match="fewer than the 20 shards"):
        P.partition(_labels(per_class=1), _fed(clients=10, partition="shards"), seed=0)
    with pytest.raises(ConfigError, match="without an example"):
        P.dirichlet(_labels(per_class=1, classes=2), 50, 0.01, seed=0)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--proximal-mu", "0.1"], "--proximal-mu is not used by --algorithm fedavg"),
        (["--dirichlet-alpha", "0.1"], "--dirichlet-alpha is not used by --partition iid"),
        (["--shards-per-client", "3", "--partition", "dirichlet"], "--partition dirichlet"),
        (["--fraction", "0"], "federated.fraction=0.0 must be in (0, 1]"),
        (["--clients", "0"], "federated.clients=0 must be >= 1"),
        (["--fed-dp-clip", "1"], "needs both --fed-dp-clip C and --fed-dp-noise"),
        (["--algorithm", "fedsgd"], "invalid choice: 'fedsgd'"),
        (["--freeze-epochs", "1"], "--freeze-epochs 1 is not read by tfopt federated"),
        (
            ["--client-runtime", "litert", "--algorithm", "fedprox"],
            "the .tflite training signature of --client-runtime litert takes plain SGD steps",
        ),
        (
            ["--engine", "simulation", "--superlink", "fed:9092"],
            "--engine simulation runs Flower's SuperLink here, and --superlink fed:9092",
        ),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(tmp_path, capsys, argv, needle):
    with pytest.raises(SystemExit) if "invalid choice" in needle else _nothing() as stopped:
        code = main([*argv, "-o", str(tmp_path / "run")])
    code = stopped.value.code if stopped else code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err
    assert not os.path.exists(tmp_path / "run")


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_the_proximal_term_pulls_a_step_back_as_computed_by_hand():
    """Two full-batch SGD steps of a softmax-regression model with FedProx's term, against the
    same steps in numpy: the second step's gradient gains mu * (w - w_global)."""
    from tfopt.core._keras import keras

    from tfopt.federated import local

    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 5)).astype(np.float32)
    y = rng.integers(0, 3, 16)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
    w0 = [rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32)]
    lr, mu = 0.5, 2.0
    got, metrics = local.fit(model, w0, x, y, epochs=2, batch_size=16, lr=lr, mu=mu, seed=1)

    w, b = (a.astype(np.float64) for a in w0)
    for _ in range(2):
        z = x @ w + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        d = (p - np.eye(3)[y]) / len(y)
        w, b = (
            w - lr * (x.T @ d + mu * (w - w0[0])),
            b - lr * (d.sum(0) + mu * (b - w0[1])),
        )
    np.testing.assert_allclose(got[0], w, atol=1e-5)
    np.testing.assert_allclose(got[1], b, atol=1e-5)
    assert 0 < metrics["loss"] and 0 <= metrics["accuracy"] <= 1


# --- real Flower processes -------------------------------------------------------------------

RUN = [
    "--clients",
    "3",
    "--rounds",
    "2",
    "--limit",
    "960",
    "--local-epochs",
    "2",
    "--batch-size",
    "16",
    "--set",
    "model.dropout=0",
]


def _start(out, *extra):
    return subprocess.Popen(
        [sys.executable, "-m", "tfopt.federated", *RUN, *extra, "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for(path, test, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the run ended early ({proc.returncode}): {proc.stdout.read()[-3000:]}")
        try:
            with open(path) as f:
                value = json.load(f)
            if test(value):
                return value
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    pytest.fail(f"{path} never passed the test")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_the_watchdog_stops_what_carries_the_runs_flwr_home_once_the_chief_is_gone(tmp_path):
    """What the watchdog does when a run's chief dies, with stand-ins: a "chief" that ends and
    two processes of "its run" (one carrying another run's FLWR_HOME, which is left alone)."""
    home, other = str(tmp_path / "flwr"), str(tmp_path / "other")
    chief = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    left = [
        subprocess.Popen(["sleep", "300"], env={**os.environ, "FLWR_HOME": h})
        for h in (home, other)
    ]
    dog = subprocess.Popen([sys.executable, "-m", "tfopt.federated.watchdog", str(chief.pid), home])
    try:
        time.sleep(1)
        assert dog.poll() is None and left[0].poll() is None  # the chief lives: nothing stopped
        chief.stdin.close()
        chief.wait()
        assert dog.wait(timeout=30) == 0
        assert left[0].wait(timeout=10) == -signal.SIGKILL
        assert left[1].poll() is None and _carrying(f"FLWR_HOME={other}") == [left[1].pid]
    finally:
        for p in (chief, dog, *left):
            p.kill()
            p.wait()


def _finished(out, *argv) -> dict:
    """``tfopt federated *argv -o out`` run to its end; its ``run.json``."""
    done = subprocess.run(
        [sys.executable, "-m", "tfopt.federated", *argv, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.load(open(out / "run.json"))


def _carrying(variable: str) -> list[int]:
    """The processes whose environment holds ``variable`` (``NAME=value``)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"\0{variable}\0".encode() in b"\0" + f.read() + b"\0":
                    found.append(int(pid))
        except OSError:
            pass
    return found


def _reference(run_dir):
    """The two rounds of FedAvg computed in a process of their own from the run's round-0 model,
    with the partition and the clients' training code, for comparison with the run's model."""
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, "fed_reference.py"), str(run_dir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_killed_server_resumes_from_its_last_round_and_equals_fedavg_computed_here(tmp_path):
    out = tmp_path / "fed"
    work = f"{out}.partial/federated"
    skewed = ("--partition", "dirichlet", "--dirichlet-alpha", "0.5")
    first = _start(out, *skewed)
    _wait_for(f"{work}/history.json", lambda rows: len(rows) >= 1, first)
    pids = json.load(open(f"{work}/pids.json"))
    first.kill()  # the chief, outright: its Flower processes die with it
    first.wait()
    deadline = time.time() + 20
    while any(map(_alive, [pids["superlink"], *pids["clients"]])) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(map(_alive, [pids["superlink"], *pids["clients"]])), pids
    # Nor does its ServerApp (not the chief's child): the run's watchdog stops it, so a run
    # killed and never started again leaves nothing running.
    deadline = time.time() + 20
    while _carrying(f"FLWR_HOME={work}/flwr") and time.time() < deadline:
        time.sleep(0.2)
    assert not _carrying(f"FLWR_HOME={work}/flwr")

    second = _start(out, *skewed)
    log = second.communicate(timeout=600)[0]
    assert second.returncode == 0, log[-3000:]
    # Nothing of either attempt lives on.
    assert not _carrying(f"FLWR_HOME={work}/flwr"), log[-2000:]
    assert "resuming after round 1" in log and "round 1/2" not in log and "round 2/2" in log, log
    record = json.load(open(out / "run.json"))
    fed = record["federated"]
    assert fed["resumed_from_round"] == 1 and [r["round"] for r in record["history"]] == [1, 2]
    assert fed["partition"]["how"] == "dirichlet" and len(set(fed["partition"]["examples"])) > 1
    assert all(r["replies"] == 3 and r["failed"] == 0 for r in record["history"])
    assert fed["bytes_per_round"] == 6 * fed["payload_bytes"]
    assert not os.path.exists(f"{out}/federated/partitions")  # the clients' data is not kept

    reference = _reference(out)
    # bit for bit: the clients train deterministically and the server sums in the clients' order
    assert reference["max_abs_diff"] == 0.0, reference
    assert reference["unweighted_diff"] > 1e-3, reference


@pytest.mark.slow
def test_the_simulation_engine_runs_the_clients_in_the_superlink_and_computes_the_same_fedavg(
    tmp_path,
):
    """Flower's simulation engine: no SuperNode process (only the SuperLink's and the server's
    logs), each virtual node reads the partition its id names, and the global model is FedAvg
    computed here, bit for bit."""
    out = tmp_path / "fed"
    record = _finished(out, *RUN, "--engine", "simulation")
    fed = record["federated"]
    assert fed["engine"] == "simulation" and "Ray actors" in fed["runs_on"]
    assert sorted(os.listdir(out / "federated" / "logs")) == ["server.log", "superlink.log"]
    assert [(r["sampled"], r["replies"], r["failed"]) for r in record["history"]] == [(3, 3, 0)] * 2
    reference = _reference(out)
    assert reference["max_abs_diff"] == 0.0, reference


@pytest.mark.slow
def test_a_killed_client_is_left_out_of_its_round_and_the_run_finishes(tmp_path):
    out = tmp_path / "fed"
    work = f"{out}.partial/federated"
    proc = _start(out)
    lines = []
    for line in proc.stdout:  # every client online: the run is about to be submitted
        lines.append(line)
        if "Flower clients online" in line:
            break
    pids = json.load(open(f"{work}/pids.json"))
    os.killpg(pids["clients"][0], signal.SIGKILL)  # client 0's SuperNode and its ClientApps
    log = "".join(lines) + proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, log[-3000:]
    record = json.load(open(out / "run.json"))
    first, second = record["history"]
    assert (first["sampled"], first["replies"], first["failed"]) == (3, 2, 1), first
    assert (second["sampled"], second["replies"], second["failed"]) == (2, 2, 0), second
    assert record["federated"]["failed_replies"] == 1
    assert second["val_accuracy"] > record["federated"]["start_val_accuracy"] + 0.2, record
    assert "2/3 clients replied" in log


@pytest.mark.slow
def test_client_level_dp_clips_each_update_adds_the_noise_and_records_its_epsilon(tmp_path):
    """One round, updates clipped to C = 1e-3 and noise sigma = 1e-3: the global model moves by
    the mean of three clipped updates (norm at most C) plus noise of norm about
    sigma C / 3 sqrt(d); without clipping the clients' updates are about 1000 times larger."""
    from tfopt.core._keras import keras

    from tfopt.federated import local
    from tfopt.privacy import accountant

    out = tmp_path / "fed"
    clip, sigma = 1e-3, 1e-3
    argv = ["--rounds", "1", "--fed-dp-clip", str(clip), "--fed-dp-noise", str(sigma)]
    record = _finished(out, *RUN, *argv)
    privacy = record["federated"]["privacy"]
    assert privacy["epsilon"] == accountant.epsilon(sigma, 1.0, 1, 1e-5)
    assert (privacy["clip"], privacy["noise_multiplier"]) == (clip, sigma)
    start, _ = local.load_arrays(out / "federated" / "initial.npz")
    end = keras.models.load_model(out / "model.keras", compile=False).get_weights()
    size = sum(a.size for a in start)
    moved = float(np.sqrt(sum(np.sum((b - a) ** 2) for a, b in zip(start, end))))
    noise = sigma * clip / 3 * np.sqrt(size)
    assert moved <= clip + 2 * noise and moved >= 0.2 * clip, (moved, clip, noise)


@pytest.mark.slow
def test_litert_clients_train_the_head_in_the_tflite_signature_as_fedavg_computed_here(
    tmp_path, mnist_run
):
    """The session's MNIST CNN fine-tuned on Fashion-MNIST by three clients that train its head
    with the .tflite ``train`` signature in LiteRT: the layers before the head are the starting
    model's, the head equals FedAvg of the same LiteRT steps computed in one process, and the
    global model learns the new classes."""
    from tfopt.core._keras import keras

    out = tmp_path / "fed"
    argv = [
        *RUN,
        "--model",
        f"{mnist_run}/model.keras",
        "--dataset",
        "fashion_mnist",
        "--client-runtime",
        "litert",
        "--client-lr",
        "0.05",
        "--partition",
        "dirichlet",
        "--dirichlet-alpha",
        "0.5",
    ]
    record = _finished(out, *argv)
    fed = record["federated"]
    assert fed["client_runtime"] == "litert" and fed["on_device"]["head"] == "logits"
    assert fed["payload_bytes"] == 4 * fed["on_device"]["trainable_params"]  # the head only
    start = keras.models.load_model(f"{mnist_run}/model.keras", compile=False)
    end = keras.models.load_model(out / "model.keras", compile=False)
    for a, b in zip(start.layers[:-1], end.layers[:-1]):
        assert all(np.array_equal(u, v) for u, v in zip(a.get_weights(), b.get_weights())), a.name
    reference = _reference(out)
    assert reference["max_abs_diff"] < 1e-6 and reference["unweighted_diff"] > 1e-4, reference
    assert record["history"][-1]["val_accuracy"] > fed["start_val_accuracy"] + 0.2, record[
        "history"
    ]


def test_without_flower_the_command_says_how_to_install_it(monkeypatch):
    import importlib.util

    from tfopt.federated import flower

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "flwr" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"pip install 'tfopt\[federated\]'"):
        flower.require_flower()


def _render(capsys, *argv):
    assert main([*argv, "--render", "kubernetes", "--image", "reg/tfopt:1"]) == 0
    import yaml

    return list(yaml.safe_load_all(capsys.readouterr().out))


def test_the_kubernetes_render_is_valid_objects_running_the_same_command(capsys):
    from kubernetes import client

    objects = _render(
        capsys, "--clients", "4", "--rounds", "7", "--name", "fl", "--namespace", "ml"
    )
    kinds = {o["kind"]: o for o in objects}
    assert list(kinds) == ["Service", "Deployment", "StatefulSet", "Job", "NetworkPolicy"]
    api = client.ApiClient()
    for o in objects:
        model = api._ApiClient__deserialize(o, f"V1{o['kind']}")
        assert model.metadata.name.startswith("fl") and model.metadata.namespace == "ml"
        assert api.sanitize_for_serialization(model) == o  # no field Kubernetes does not know
    job = kinds["Job"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert job == [
        "python", "-m", "tfopt.federated", "--clients", "4", "--rounds", "7",
        "-o", "/runs/fl", "--superlink", "fl-superlink:8000",
    ]  # fmt: skip
    assert kinds["StatefulSet"]["spec"]["replicas"] == 4
    node = kinds["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "--superlink fl-superlink:8000" in node and "num-partitions=4" in node
    volumes = [o["spec"]["template"]["spec"]["volumes"] for o in objects if "template" in o["spec"]]
    assert all(
        v == [{"name": "runs", "persistentVolumeClaim": {"claimName": "tfopt-runs"}}]
        for v in volumes
    )


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--image", "x"], "--image apply to --render kubernetes only"),
        (["--render", "kubernetes"], "--render kubernetes needs --image"),
        (
            ["--render", "kubernetes", "--image", "x", "--name", "Bad_Name"],
            "is not a Kubernetes name",
        ),
        (["--render", "kubernetes", "--image", "x", "--superlink", "a:1"], "drop --superlink"),
    ],
)
def test_render_mistakes_are_one_line(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


@pytest.mark.slow
def test_the_rendered_superlink_supernodes_and_job_run_together_here(tmp_path, capsys):
    """The commands of the rendered objects, run as processes of this machine: the Service's
    name and port become a free loopback port, the claim a temporary directory, and each
    SuperNode, which has a pod of its own in a cluster, gets a port of its own."""
    from tfopt.federated.flower import _free_ports

    objects = {o["kind"]: o for o in _render(capsys, *RUN, "--name", "fl")}

    def command(kind):
        return objects[kind]["spec"]["template"]["spec"]["containers"][0]["command"]

    port, *ports = _free_ports(4)
    here = f"127.0.0.1:{port}"
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FLWR_TELEMETRY_ENABLED": "0"}
    link = [
        here.split(":")[0] if w == "0.0.0.0" else str(port) if w == "8000" else w
        for w in command("Deployment")
    ]
    logs = open(tmp_path / "flower.log", "w")
    quiet = {"stdout": logs, "stderr": subprocess.STDOUT, "start_new_session": True}
    procs = [subprocess.Popen(link, env={**env, "FLWR_HOME": str(tmp_path / "link")}, **quiet)]
    try:
        for i, p in enumerate(ports):
            node = command("StatefulSet")[2].replace("fl-superlink:8000", here) + f" --port {p}"
            node_env = {
                **env,
                "HOSTNAME": f"fl-clients-{i}",
                "FLWR_HOME": str(tmp_path / f"node{i}"),
            }
            procs.append(subprocess.Popen(["sh", "-c", node], env=node_env, **quiet))
        job = [sys.executable if w == "python" else w for w in command("Job")]
        job = [
            here if w == "fl-superlink:8000" else str(tmp_path / "fl") if w == "/runs/fl" else w
            for w in job
        ]
        done = subprocess.run(job, capture_output=True, text=True, timeout=600)
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        logs.close()
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.load(open(tmp_path / "fl" / "run.json"))
    assert record["federated"]["runs_on"] == f"flower deployment at {here}"
    assert [(r["sampled"], r["replies"]) for r in record["history"]] == [(3, 3), (3, 3)]
