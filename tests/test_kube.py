"""Kubernetes: the TFJob that `python -m tfopt.launch --render kubeflow` prints.

Every render goes through three independent checks:

* ``sdk``: the Kubeflow SDK's models (``kubeflow-training==1.9.4``) deserialize it, as the
  SDK does an API server's answer (wrong types and a missing ``runPolicy`` are refused), and
  serialize it back unchanged (a field the models do not know would be dropped);
* ``crd``: the TFJob CRD's OpenAPI v3 schema (``tests/data/tfjob_crd_schema.json``, trimmed
  from the training operator's manifests), with unknown fields refused;
* ``tfopt``: :func:`tfopt.launch.kube.check_tfjob` (container named ``tensorflow``, one chief,
  restart-policy values, the ``tfjob-port``, ``runPolicy`` present).

The negative tests mutate a correct render and state which of the three catch each mistake.
"""

import argparse
import copy
import json
import os
import subprocess
import sys

import jsonschema
import pytest
import yaml
from kubeflow.training import ApiClient, KubeflowOrgV1TFJob

from tfopt.core.errors import ConfigError
from tfopt.launch import kube

SCHEMA_FILE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "data", "tfjob_crd_schema.json"
)
BRIEF = [
    "--render",
    "kubeflow",
    "--chief",
    "--workers",
    "4",
    "--ps",
    "2",
    "--evaluator",
    "--image",
    "REG/tfopt:1",
]
PS_COMMAND = ["python", "-m", "tfopt.train", "--strategy", "parameter_server"]


def launcher_parser() -> argparse.ArgumentParser:
    """The launcher's own task-count options, plus the ones tfopt.launch.kube adds."""
    parser = argparse.ArgumentParser(prog="python -m tfopt.launch")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ps", type=int, default=0)
    parser.add_argument("--chief", action="store_true")
    parser.add_argument("--evaluator", action="store_true")
    parser.add_argument("--data-workers", type=int, default=0)
    kube.add_render_arguments(parser)
    return parser


def render_text(argv: list[str], command: list[str] = PS_COMMAND) -> str:
    return kube.render_from_args(launcher_parser().parse_args(argv), command)


def render(argv: list[str], command: list[str] = PS_COMMAND) -> dict:
    return next(
        yaml.safe_load_all(render_text(argv, command))
    )  # the TFJob; its NetworkPolicy follows


# -- the three checks ----------------------------------------------------------------------


class _Response:
    """What ``ApiClient.deserialize`` reads: an HTTP response with a JSON body."""

    def __init__(self, doc):
        self.data = json.dumps(doc)


SDK = ApiClient()


def sdk_check(doc: dict) -> None:
    # deserialize refuses e.g. replicas: "two" or a missing runPolicy; it quietly turns "4" into 4
    # and drops fields it does not know, which the round trip shows.
    job = SDK.deserialize(_Response(doc), "KubeflowOrgV1TFJob")
    if SDK.sanitize_for_serialization(job) != doc:
        raise ValueError("the SDK's models drop or change fields of this TFJob")


def _strict(schema):
    """The schema with unknown fields refused: a misspelt field name must fail, not vanish."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


with open(SCHEMA_FILE) as _f:
    CRD_SCHEMA = json.load(_f)
CRD_VALIDATOR = jsonschema.Draft7Validator(_strict(CRD_SCHEMA))


def crd_check(doc: dict) -> None:
    CRD_VALIDATOR.validate(doc)


CHECKS = {"sdk": sdk_check, "crd": crd_check, "tfopt": kube.check_tfjob}


def rejected_by(doc: dict) -> set[str]:
    out = set()
    for name, check in CHECKS.items():
        try:
            check(copy.deepcopy(doc))
        except (ValueError, TypeError, jsonschema.ValidationError):  # ConfigError is a ValueError
            out.add(name)
    return out


# -- the brief's example -------------------------------------------------------------------


def test_example_renders_a_valid_tfjob():
    doc = render(BRIEF)
    assert rejected_by(doc) == set()
    assert (doc["apiVersion"], doc["kind"], doc["metadata"]) == (
        "kubeflow.org/v1",
        "TFJob",
        {"name": "tfopt"},
    )
    assert doc["spec"]["runPolicy"] == {"backoffLimit": 3, "cleanPodPolicy": "Running"}
    specs = doc["spec"]["tfReplicaSpecs"]
    assert {role: s["replicas"] for role, s in specs.items()} == {
        "Chief": 1,
        "Worker": 4,
        "PS": 2,
        "Evaluator": 1,
    }
    assert list(specs) == ["Chief", "Worker", "PS", "Evaluator"]
    for spec in specs.values():
        assert spec["restartPolicy"] == "ExitCode"
        pod = spec["template"]["spec"]
        assert spec["template"]["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
        [container] = pod["containers"]
        assert container["name"] == "tensorflow"
        assert container["image"] == "REG/tfopt:1"
        # Every replica and every restart writes the same run directory, on the shared volume.
        assert container["command"] == PS_COMMAND + ["-o", "/runs/tfopt"]
        assert container["ports"] == [{"name": "tfjob-port", "containerPort": 2222}]
        assert container["volumeMounts"] == [{"name": "runs", "mountPath": "/runs"}]
        assert container["resources"] == {}
        assert pod["volumes"] == [
            {"name": "runs", "persistentVolumeClaim": {"claimName": "tfopt-runs"}}
        ]


def test_yaml_is_plain():
    text = render_text(BRIEF)
    assert "&id" not in text and "*id" not in text  # no anchors: every replica spelled out
    assert "sidecar.istio.io/inject: 'false'" in text  # a string, as annotations must be


def test_sdk_reads_typed_values():
    job = SDK.deserialize(_Response(render(BRIEF + ["--namespace", "ml"])), "KubeflowOrgV1TFJob")
    assert isinstance(job, KubeflowOrgV1TFJob)
    assert job.metadata.namespace == "ml"
    assert (
        job.spec.run_policy.backoff_limit == 3 and job.spec.run_policy.clean_pod_policy == "Running"
    )
    worker = job.spec.tf_replica_specs["Worker"]
    assert worker.replicas == 4 and worker.restart_policy == "ExitCode"
    container = worker.template.spec.containers[0]
    assert (container.name, container.ports[0].name, container.ports[0].container_port) == (
        "tensorflow",
        "tfjob-port",
        2222,
    )
    assert worker.template.spec.volumes[0].persistent_volume_claim.claim_name == "tfopt-runs"


def test_every_option_lands_in_the_job():
    doc = render(
        [
            "--render",
            "kubeflow",
            "--chief",
            "--workers",
            "2",
            "--ps",
            "1",
            "--evaluator",
            "--image",
            "reg.example.com/team/tfopt:2",
            "--name",
            "mnist-ps",
            "--namespace",
            "ml-team",
            "--restart-policy",
            "OnFailure",
            "--backoff-limit",
            "6",
            "--clean-pod-policy",
            "All",
            "--cpu",
            "500m",
            "--memory",
            "8Gi",
            "--gpus",
            "2",
            "--volume-claim",
            "shared.runs",
            "--mount-path",
            "/mnt/runs/",
        ]
    )
    assert rejected_by(doc) == set()
    assert doc["metadata"] == {"name": "mnist-ps", "namespace": "ml-team"}
    assert doc["spec"]["runPolicy"] == {"backoffLimit": 6, "cleanPodPolicy": "All"}
    for role, spec in doc["spec"]["tfReplicaSpecs"].items():
        assert spec["restartPolicy"] == "OnFailure"
        container = spec["template"]["spec"]["containers"][0]
        assert container["command"][-2:] == ["-o", "/mnt/runs/mnist-ps"]
        assert container["volumeMounts"][0]["mountPath"] == "/mnt/runs"
        assert (
            spec["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
            == "shared.runs"
        )
        amounts = {"cpu": "500m", "memory": "8Gi"}
        limits = (
            amounts if role == "PS" else {**amounts, "nvidia.com/gpu": "2"}
        )  # parameter servers get no GPU
        assert container["resources"] == {"requests": amounts, "limits": limits}


def test_gpus_alone_are_a_limit():
    doc = render(["--render", "kubeflow", "--workers", "2", "--image", "i", "--gpus", "1"])
    container = doc["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert rejected_by(doc) == set()


def test_multi_worker_mirrored_without_chief():
    doc = render(
        ["--render", "kubeflow", "--workers", "3", "--image", "i"],
        ["python", "-m", "tfopt.train", "--strategy", "multi_worker_mirrored"],
    )
    assert list(doc["spec"]["tfReplicaSpecs"]) == ["Worker"]
    assert doc["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] == 3
    assert rejected_by(doc) == set()


def test_parser_defaults_and_group():
    parser = launcher_parser()
    args = parser.parse_args([])
    assert (args.render, args.image, args.name, args.namespace) == (None, None, "tfopt", None)
    assert (args.restart_policy, args.backoff_limit, args.clean_pod_policy) == (
        "ExitCode",
        3,
        "Running",
    )
    assert (args.cpu, args.memory, args.gpus, args.volume_claim, args.mount_path) == (
        None,
        None,
        0,
        "tfopt-runs",
        "/runs",
    )
    assert "Kubernetes (--render kubeflow)" in parser.format_help()


@pytest.mark.parametrize(
    "argv", [["--restart-policy", "Never"], ["--clean-pod-policy", "Some"], ["--render", "argo"]]
)
def test_parser_refuses_other_choices(argv, capsys):
    with pytest.raises(SystemExit) as err:
        launcher_parser().parse_args(argv)
    assert err.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_kube_does_not_import_tensorflow():
    code = "import sys, tfopt.launch.kube; print(sorted(m for m in ('tensorflow', 'tf_keras', 'yaml') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


# -- the command every replica runs ----------------------------------------------------------

COMMANDS = [
    # (id, command, expected command in the pods)
    (
        "appended",
        ["python", "-m", "tfopt.train"],
        ["python", "-m", "tfopt.train", "-o", "/runs/tfopt"],
    ),
    (
        "console-script",
        ["tfopt", "distill", "--epochs", "2"],
        ["tfopt", "distill", "--epochs", "2", "-o", "/runs/tfopt"],
    ),
    (
        "python-m-tfopt",
        ["python3", "-m", "tfopt", "optimize"],
        ["python3", "-m", "tfopt", "optimize", "-o", "/runs/tfopt"],
    ),
    (
        "before-separator",
        ["python", "-m", "tfopt.export", "--", "x"],
        ["python", "-m", "tfopt.export", "-o", "/runs/tfopt", "--", "x"],
    ),
    (
        "own-o-kept",
        ["python", "-m", "tfopt.train", "-o", "/runs/exp1"],
        ["python", "-m", "tfopt.train", "-o", "/runs/exp1"],
    ),
    (
        "own-output-kept",
        ["python", "-m", "tfopt.train", "--output=/runs/a/b"],
        ["python", "-m", "tfopt.train", "--output=/runs/a/b"],
    ),
    (
        "own-set-kept",
        ["python", "-m", "tfopt.train", "--set", "train.output_dir=/runs/c"],
        ["python", "-m", "tfopt.train", "--set", "train.output_dir=/runs/c"],
    ),
    (
        "other-program",
        ["python", "my_train.py", "-o", "out"],
        ["python", "my_train.py", "-o", "out"],
    ),
    (
        "not-a-stage",
        ["python", "-m", "tfopt.launch", "--help"],
        ["python", "-m", "tfopt.launch", "--help"],
    ),
]


@pytest.mark.parametrize(
    "command,expected", [c[1:] for c in COMMANDS], ids=[c[0] for c in COMMANDS]
)
def test_command_runs_in_the_shared_directory(command, expected):
    doc = render(["--render", "kubeflow", "--workers", "2", "--image", "i"], command)
    assert (
        doc["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
        == expected
    )


@pytest.mark.parametrize("output", ["runs/x", "/tmp/x", "/runsx", "/runs/../etc", ""])
def test_output_off_the_shared_volume_is_refused(output):
    with pytest.raises(ConfigError) as err:
        render_text(
            ["--render", "kubeflow", "--image", "i"], ["python", "-m", "tfopt.train", "-o", output]
        )
    message = str(err.value)
    assert (
        repr(output) in message and "--mount-path /runs" in message and "-o /runs/tfopt" in message
    )


# -- bad input: one line naming the value, the rule and the fix ------------------------------------

BAD_ARGS = [
    # (id, launcher arguments, command, substrings of the message)
    ("no-image", ["--render", "kubeflow"], PS_COMMAND, ["--image", "registry.example.com/tfopt:1"]),
    ("no-command", ["--render", "kubeflow", "--image", "i"], [], ["no command", "after `--`"]),
    ("name-upper", ["--name", "MyJob"], None, ["--name='MyJob'", "DNS-1035", "lower-case"]),
    ("name-digit-first", ["--name", "1job"], None, ["--name='1job'", "starting with a letter"]),
    ("name-underscore", ["--name", "my_job"], None, ["--name='my_job'", "DNS-1035"]),
    ("name-64", ["--name", "a" * 64], None, ["at most 63 characters"]),
    (
        "name-too-long-for-pods",
        ["--name", "a" * 55, "--workers", "12"],
        None,
        [
            "'" + "a" * 55 + "-worker-11' 65 characters long",
            "allows 63",
            "shorten --name to at most 53",
        ],
    ),
    ("namespace", ["--namespace", "Team"], None, ["--namespace='Team'", "DNS-1123"]),
    ("workers-negative", ["--workers", "-1"], None, ["--workers=-1", ">= 0"]),
    ("ps-negative", ["--chief", "--ps", "-2"], None, ["--ps=-2", ">= 0"]),
    ("ps-without-chief", ["--ps", "2"], None, ["--ps=2 needs --chief", "add --chief or drop --ps"]),
    (
        "ps-without-workers",
        ["--chief", "--workers", "0", "--ps", "1"],
        None,
        ["--ps=1 needs --chief and --workers >= 1"],
    ),
    ("no-task", ["--workers", "0"], None, ["--workers=0 without --chief", "--workers 1"]),
    ("cpu-word", ["--cpu", "two"], None, ["--cpu='two'", "Kubernetes quantity", "500m"]),
    ("cpu-zero", ["--cpu", "0"], None, ["--cpu='0'", "positive"]),
    ("cpu-negative", ["--cpu", "-1"], None, ["--cpu='-1'"]),
    ("memory-gb", ["--memory", "8GB"], None, ["--memory='8GB'", "8Gi", "Ki Mi Gi"]),
    ("gpus-negative", ["--gpus", "-1"], None, ["--gpus=-1", ">= 0"]),
    ("backoff-negative", ["--backoff-limit", "-1"], None, ["--backoff-limit=-1", ">= 0"]),
    (
        "claim",
        ["--volume-claim", "Runs_PVC"],
        None,
        ["--volume-claim='Runs_PVC'", "PersistentVolumeClaim"],
    ),
    (
        "mount-relative",
        ["--mount-path", "runs"],
        None,
        ["--mount-path='runs'", "absolute", "--mount-path /runs"],
    ),
    ("mount-root", ["--mount-path", "/"], None, ["--mount-path='/'", "other than /"]),
    ("mount-colon", ["--mount-path", "/a:b"], None, ["--mount-path='/a:b'", "':'"]),
]


@pytest.mark.parametrize(
    "argv,command,expected", [b[1:] for b in BAD_ARGS], ids=[b[0] for b in BAD_ARGS]
)
def test_bad_arguments(argv, command, expected):
    if not argv[:1] == ["--render"]:
        argv = ["--render", "kubeflow", "--image", "REG/tfopt:1"] + argv
    with pytest.raises(ConfigError) as err:
        render_text(argv, PS_COMMAND if command is None else command)
    message = str(err.value)
    assert "\n" not in message
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


BAD_CALLS = [
    # (id, keyword arguments of render_tfjob, substrings of the message)
    ("two-chiefs", {"chief": 2}, ["--chief=2", "at most one chief"]),
    ("two-evaluators", {"evaluator": 2}, ["--evaluator=2", "at most one evaluator"]),
    ("workers-string", {"workers": "2"}, ["--workers='2'", "integer"]),
    (
        "restart-never",
        {"restart_policy": "Never"},
        ["--restart-policy='Never'", "ExitCode, OnFailure"],
    ),
    (
        "clean-sometimes",
        {"clean_pod_policy": "Sometimes"},
        ["--clean-pod-policy='Sometimes'", "Running, All, None"],
    ),
    ("command-string", {"command": "python -m tfopt.train"}, ["must be a list of strings"]),
    ("image-space", {"image": "reg/tfopt 1"}, ["--image='reg/tfopt 1'"]),
]


@pytest.mark.parametrize(
    "kwargs,expected", [b[1:] for b in BAD_CALLS], ids=[b[0] for b in BAD_CALLS]
)
def test_render_tfjob_refuses(kwargs, expected):
    call = {
        "name": "job",
        "image": "i",
        "command": ["python", "-m", "tfopt.train"],
        "chief": True,
        "workers": 2,
    }
    with pytest.raises(ConfigError) as err:
        kube.render_tfjob(**{**call, **kwargs})
    message = str(err.value)
    assert "\n" not in message
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


def test_render_tfjob_is_pure():
    call = {
        "name": "job",
        "image": "i",
        "command": ["python", "-m", "tfopt.train"],
        "chief": True,
        "workers": 2,
    }
    first = kube.render_tfjob(**call)
    assert kube.render_tfjob(**call) == first
    assert call["command"] == ["python", "-m", "tfopt.train"]  # the caller's list is not modified
    worker = first["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["command"].append("x")
    assert (
        first["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]["command"][-1]
        != "x"
    )


# -- a correct render, mutated: which check catches what -----------------------------------------


def _worker(doc):
    return doc["spec"]["tfReplicaSpecs"]["Worker"]


def _container(doc):
    return _worker(doc)["template"]["spec"]["containers"][0]


def _two_chief_types(doc):
    doc["spec"]["tfReplicaSpecs"]["Master"] = copy.deepcopy(doc["spec"]["tfReplicaSpecs"]["Chief"])


def _no_port(doc):
    _container(doc)["ports"] = []


MUTATIONS = [
    # (id, mutation, the checks that must reject it)
    ("replicas-two", lambda d: _worker(d).update(replicas="two"), {"sdk", "crd", "tfopt"}),
    ("replicas-numeral-string", lambda d: _worker(d).update(replicas="4"), {"sdk", "crd", "tfopt"}),
    ("no-run-policy", lambda d: d["spec"].pop("runPolicy"), {"sdk", "tfopt"}),
    ("container-not-tensorflow", lambda d: _container(d).update(name="trainer"), {"tfopt"}),
    ("two-chiefs", lambda d: d["spec"]["tfReplicaSpecs"]["Chief"].update(replicas=2), {"tfopt"}),
    ("chief-and-master", _two_chief_types, {"tfopt"}),
    ("restart-sometimes", lambda d: _worker(d).update(restartPolicy="Sometimes"), {"tfopt"}),
    (
        "restart-misspelt",
        lambda d: _worker(d).update(restartpolicy=_worker(d).pop("restartPolicy")),
        {"sdk", "crd", "tfopt"},
    ),
    (
        "command-string",
        lambda d: _container(d).update(command="python -m tfopt.train"),
        {"sdk", "crd"},
    ),
    ("no-tfjob-port", _no_port, {"tfopt"}),
    ("port-2223", lambda d: _container(d)["ports"][0].update(containerPort=2223), {"tfopt"}),
    (
        "port-name-only",
        lambda d: _container(d)["ports"][0].pop("containerPort"),
        {"sdk", "crd", "tfopt"},
    ),
    (
        "clean-sometimes",
        lambda d: d["spec"]["runPolicy"].update(cleanPodPolicy="Sometimes"),
        {"tfopt"},
    ),
    (
        "backoff-string",
        lambda d: d["spec"]["runPolicy"].update(backoffLimit="3"),
        {"sdk", "crd", "tfopt"},
    ),
    ("no-replica-specs", lambda d: d["spec"].pop("tfReplicaSpecs"), {"sdk", "crd", "tfopt"}),
    (
        "two-evaluators",
        lambda d: d["spec"]["tfReplicaSpecs"]["Evaluator"].update(replicas=2),
        {"tfopt"},
    ),
    ("ps-without-chief", lambda d: d["spec"]["tfReplicaSpecs"].pop("Chief"), {"tfopt"}),
    (
        "volume-without-claim",
        lambda d: _worker(d)["template"]["spec"]["volumes"][0]["persistentVolumeClaim"].clear(),
        {"sdk", "crd"},
    ),
    ("no-image", lambda d: _container(d).pop("image"), {"tfopt"}),
    (
        "unknown-replica-type",
        lambda d: d["spec"]["tfReplicaSpecs"].update(Trainer=copy.deepcopy(_worker(d))),
        {"tfopt"},
    ),
    ("wrong-kind", lambda d: d.update(kind="PyTorchJob"), {"tfopt"}),
]


@pytest.mark.parametrize(
    "mutate,expected", [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS]
)
@pytest.mark.slow
def test_mutated_render_is_caught(mutate, expected):
    doc = render(BRIEF)
    assert rejected_by(doc) == set()
    mutate(doc)
    assert rejected_by(doc) == expected


@pytest.mark.parametrize(
    "mutate",
    [m[1] for m in MUTATIONS if "tfopt" in m[2]],
    ids=[m[0] for m in MUTATIONS if "tfopt" in m[2]],
)
def test_check_tfjob_messages_are_one_line(mutate):
    doc = render(BRIEF)
    mutate(doc)
    with pytest.raises(ConfigError) as err:
        kube.check_tfjob(doc)
    assert "\n" not in str(err.value)


def test_check_tfjob_names_the_field():
    doc = render(BRIEF)
    _worker(doc)["restartPolicy"] = "Sometimes"
    with pytest.raises(
        ConfigError,
        match=r"spec\.tfReplicaSpecs\.Worker\.restartPolicy='Sometimes' is not one of "
        r"Always, OnFailure, Never, ExitCode",
    ):
        kube.check_tfjob(doc)
    doc = render(BRIEF)
    _container(doc)["name"] = "trainer"
    with pytest.raises(
        ConfigError, match=r"Worker has 0 containers named 'tensorflow' \(names: \['trainer'\]\)"
    ):
        kube.check_tfjob(doc)


def test_check_tfjob_accepts_the_operators_master():
    doc = render(BRIEF)
    specs = doc["spec"]["tfReplicaSpecs"]
    specs["Master"] = specs.pop("Chief")
    kube.check_tfjob(doc)


def test_vendored_schema_says_where_it_comes_from():
    comment = " ".join(CRD_SCHEMA["$comment"])
    assert "kubeflow/training-operator" in comment and "kubeflow.org_tfjobs.yaml" in comment
    assert "07a4a89697d80501695ae59f2d9a22aa27fd5044" in comment
    # The strict copy refuses what the upstream schema would let through unnoticed.
    doc = render(BRIEF)
    doc["spec"]["tfReplicaSpec"] = doc["spec"].pop("tfReplicaSpecs")
    with pytest.raises(jsonschema.ValidationError):
        crd_check(doc)


def test_a_network_policy_admits_only_the_jobs_own_pods():
    """TF's gRPC servers are unauthenticated: the render comes with a policy that admits only the job's pods."""
    from kubernetes.client import ApiClient as K8sClient

    job, policy, *rest = yaml.safe_load_all(
        render_text([*BRIEF, "--name", "mnist-ps", "--namespace", "ml"])
    )
    assert rest == [] and (policy["apiVersion"], policy["kind"]) == (
        "networking.k8s.io/v1",
        "NetworkPolicy",
    )
    k8s = K8sClient()
    typed = k8s.deserialize(
        _Response(policy), "V1NetworkPolicy"
    )  # the Kubernetes client's own model
    assert k8s.sanitize_for_serialization(typed) == policy  # nothing it does not know
    assert policy["metadata"] == {"name": "mnist-ps-only-own-pods", "namespace": "ml"}
    labels = {
        role: spec["template"]["metadata"]["labels"]
        for role, spec in job["spec"]["tfReplicaSpecs"].items()
    }
    assert set(labels) == {"Chief", "Worker", "PS", "Evaluator"}
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert all(
        selected.items() <= pod.items() for pod in labels.values()
    )  # every pod of the job is covered
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress (data, image pulls) stays open
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": selected}}]}]
    other = next(yaml.safe_load_all(render_text([*BRIEF, "--name", "other"])))
    assert (
        not selected.items()
        <= other["spec"]["tfReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"].items()
    )


# -- the tf.data service of --data-workers N -------------------------------------------------


def test_data_workers_render_the_service_beside_the_job():
    from kubernetes.client import ApiClient as K8sClient

    from tfopt.data.serve import build_parser as serve_parser

    docs = list(
        yaml.safe_load_all(
            render_text([*BRIEF, "--name", "mnist", "--namespace", "ml", "--data-workers", "3"])
        )
    )
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert kinds == [
        ("TFJob", "mnist"),
        ("Deployment", "mnist-data-dispatcher"),
        ("Service", "mnist-data-dispatcher"),
        ("Deployment", "mnist-data-worker"),
        ("NetworkPolicy", "mnist-only-own-pods"),
    ]
    job, dispatcher, service, worker, policy = docs
    assert rejected_by(job) == set()
    k8s = K8sClient()
    for doc, model in (
        (dispatcher, "V1Deployment"),
        (service, "V1Service"),
        (worker, "V1Deployment"),
    ):
        typed = k8s.deserialize(_Response(doc), model)
        assert k8s.sanitize_for_serialization(typed) == doc, model  # nothing it does not know
        assert doc["metadata"]["namespace"] == "ml"
    # Every replica of the TFJob dials the dispatcher's Service.
    target = "grpc://mnist-data-dispatcher:5050"
    for spec in job["spec"]["tfReplicaSpecs"].values():
        assert {"name": "TFOPT_DATA_SERVICE", "value": target} in spec["template"]["spec"][
            "containers"
        ][0]["env"]
    pod_labels = dispatcher["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["port"] == 5050
    assert dispatcher["spec"]["replicas"] == 1 and worker["spec"]["replicas"] == 3
    assert dispatcher["spec"]["strategy"] == {"type": "Recreate"}
    for deployment in (dispatcher, worker):
        template = deployment["spec"]["template"]
        assert deployment["spec"]["selector"]["matchLabels"] == template["metadata"]["labels"]
        # The job's NetworkPolicy covers the service's pods too.
        assert (
            policy["spec"]["podSelector"]["matchLabels"].items()
            <= template["metadata"]["labels"].items()
        )
        [container] = template["spec"]["containers"]
        assert container["command"][:3] == ["python", "-m", "tfopt.data.serve"]
        serve_parser().parse_args(container["command"][3:])  # the commands tfopt.data.serve takes
    [dispatch] = dispatcher["spec"]["template"]["spec"]["containers"]
    assert dispatch["command"][-2:] == ["--work-dir", "/runs/mnist/data-dispatcher"]
    assert dispatch["volumeMounts"] == [{"name": "runs", "mountPath": "/runs"}]
    [work] = worker["spec"]["template"]["spec"]["containers"]
    assert work["command"][3:] == [
        "worker",
        "--dispatcher",
        "mnist-data-dispatcher:5050",
        "--host",
        "$(POD_IP)",
        "--port",
        "5051",
    ]
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in work[
        "env"
    ]
    # Without --data-workers: no service, and no address in the replicas.
    plain = list(yaml.safe_load_all(render_text(BRIEF)))
    assert [d["kind"] for d in plain] == ["TFJob", "NetworkPolicy"]
    assert "TFOPT_DATA_SERVICE" not in render_text(BRIEF)


def test_a_name_too_long_for_the_dispatcher_service_is_refused():
    name = "n" * 48
    with pytest.raises(ConfigError, match=r"shorten --name to at most 47 characters"):
        render_text(["--render", "kubeflow", "--image", "i", "--name", name, "--data-workers", "1"])
