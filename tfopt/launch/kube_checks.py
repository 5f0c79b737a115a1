"""What a TFJob rendering may contain: the Kubernetes and training-operator rules its input and its
output are checked against (names, quantities, counts, restart policies, mount paths), and the
constants both sides share."""

from __future__ import annotations

import posixpath
import re
from typing import Any

from tfopt.core.errors import ConfigError

API_VERSION, KIND = "kubeflow.org/v1", "TFJob"
RENDER_TARGETS = ("kubeflow",)
RESTART_POLICIES = (
    "ExitCode",
    "OnFailure",
)  # what --restart-policy offers (see the module docstring)
OPERATOR_RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")  # what the operator knows
CLEAN_POD_POLICIES = ("Running", "All", "None")
REPLICA_TYPES = ("Chief", "Worker", "PS", "Evaluator")  # rendered in this order
OPERATOR_REPLICA_TYPES = ("Chief", "Master", "Worker", "PS", "Evaluator")
CONTAINER_NAME = (
    "tensorflow"  # the operator sets TF_CONFIG in, and reads the exit code of, this container only
)
PORT_NAME, PORT = "tfjob-port", 2222
VOLUME_NAME = "runs"
GPU_RESOURCE = "nvidia.com/gpu"
ISTIO_INJECT = "sidecar.istio.io/inject"
JOB_LABEL = "tfopt.dev/job"  # on every pod of the job: what its NetworkPolicy admits
DEFAULT_NAME, DEFAULT_CLAIM, DEFAULT_MOUNT = "tfopt", "tfopt-runs", "/runs"
ROLE_LABEL = "tfopt.dev/role"  # on the tf.data service pods: what their Deployment selects
DISPATCHER_PORT, DATA_WORKER_PORT = 5050, 5051

DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# A Kubernetes quantity, as the TFJob CRD's schema states it, without a sign.
NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY = re.compile(rf"{NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?{NUMBER}))?")


def check_tfjob(doc: dict) -> None:
    """tfopt's own checks of a TFJob, beyond what the TFJob schema can say.

    The operator sets TF_CONFIG in, and reads the exit code of, the container named
    ``tensorflow`` only; TensorFlow allows one chief (Chief and Master are the same role) and
    one evaluator; the Kubeflow SDK refuses a TFJob without ``runPolicy``.

    Args:
        doc: A TFJob as a dict (e.g. ``yaml.safe_load`` of a file, or :func:`render_tfjob`'s).

    Raises:
        ConfigError: the first problem found, in one line naming its field.
    """
    if not isinstance(doc, dict):
        raise ConfigError(
            f"a TFJob must be a mapping, got {type(doc).__name__}; render it with --render kubeflow"
        )
    if (doc.get("apiVersion"), doc.get("kind")) != (API_VERSION, KIND):
        raise ConfigError(
            f"apiVersion/kind={doc.get('apiVersion')!r}/{doc.get('kind')!r} is not "
            f"{API_VERSION}/{KIND}; this is not a training-operator v1 TFJob"
        )
    spec = mapping(doc.get("spec"), "spec")
    check_run_policy(spec.get("runPolicy"))
    specs = mapping(spec.get("tfReplicaSpecs"), "spec.tfReplicaSpecs")
    if not specs:
        raise ConfigError("TFJob spec.tfReplicaSpecs is empty; add a Chief or Worker replica")
    replicas = {role: check_replica(role, value) for role, value in specs.items()}
    chiefs = replicas.get("Chief", 0) + replicas.get("Master", 0)
    if chiefs > 1:
        raise ConfigError(
            f"TFJob has {chiefs} chiefs (Chief/Master replicas); TensorFlow allows at most one "
            "chief: set replicas: 1 and make the others workers"
        )
    if replicas.get("Evaluator", 0) > 1:
        raise ConfigError(
            f"TFJob spec.tfReplicaSpecs.Evaluator.replicas={replicas['Evaluator']}; TensorFlow "
            "allows at most one evaluator: set replicas: 1"
        )
    if replicas.get("PS", 0) and not (chiefs and replicas.get("Worker", 0)):
        raise ConfigError(
            f"TFJob has {replicas['PS']} PS replica(s) but chief:{chiefs} worker:"
            f"{replicas.get('Worker', 0)}; ParameterServerStrategy needs one Chief and >= 1 Worker"
        )


def check_command(command: Any) -> list[str]:
    if not command:
        raise ConfigError(
            "no command to render; put it after `--`, e.g. `python -m tfopt.launch --render kubeflow "
            "--image REG/tfopt:1 --workers 2 -- python -m tfopt.train`"
        )
    if not isinstance(command, (list, tuple)) or not all(isinstance(a, str) for a in command):
        raise ConfigError(f"command={command!r} must be a list of strings (one per argument)")
    return list(command)


def check_image(image: Any) -> None:
    if not isinstance(image, str) or not image or any(c.isspace() for c in image):
        raise ConfigError(
            f"--image={image!r} is not a container image reference; give e.g. "
            "--image registry.example.com/tfopt:1"
        )


def check_dns(value: Any, flag: str, pattern: re.Pattern, limit: int, rule: str, fix: str) -> None:
    if not isinstance(value, str) or not pattern.fullmatch(value) or len(value) > limit:
        raise ConfigError(
            f"{flag}={value!r} is not {rule} of at most {limit} characters; use {fix}"
        )


def check_count(value: Any, flag: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{flag}={value!r} must be an integer >= 0")
    return value


def check_counts(chief: Any, workers: Any, ps: Any, evaluator: Any) -> dict[str, int]:
    n_chief = check_count(int(chief) if isinstance(chief, bool) else chief, "--chief")
    if n_chief > 1:
        raise ConfigError(
            f"--chief={n_chief}: a TFJob has at most one chief (TensorFlow's rule); "
            "give --chief once and make the others --workers"
        )
    workers, ps = check_count(workers, "--workers"), check_count(ps, "--ps")
    n_eval = check_count(
        int(evaluator) if isinstance(evaluator, bool) else evaluator, "--evaluator"
    )
    if n_eval > 1:
        raise ConfigError(
            f"--evaluator={n_eval}: TensorFlow allows at most one evaluator; give --evaluator once"
        )
    if workers + n_chief < 1:
        raise ConfigError(
            f"--workers={workers} without --chief renders no training task; give --workers 1 or more"
        )
    if ps and (not n_chief or workers < 1):
        raise ConfigError(
            f"--ps={ps} needs --chief and --workers >= 1 (ParameterServerStrategy: one chief, "
            "workers and ps tasks); add --chief or drop --ps"
        )
    counts = dict(zip(REPLICA_TYPES, (n_chief, workers, ps, n_eval), strict=True))
    return {role: n for role, n in counts.items() if n}


def check_host_names(name: str, counts: dict[str, int]) -> None:
    # Each pod gets a Service <name>-<role>-<index>: a DNS-1035 label, so at most 63 characters.
    longest = max((f"{name}-{role.lower()}-{n - 1}" for role, n in counts.items()), key=len)
    if len(longest) > 63:
        room = 63 - (len(longest) - len(name))
        raise ConfigError(
            f"--name={name!r} makes the pod and Service name {longest!r} {len(longest)} characters "
            f"long; Kubernetes allows 63: shorten --name to at most {room} characters"
        )


def check_choice(value: Any, flag: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{flag}={value!r} is not one of {', '.join(choices)}; pick one of them")


def quantity(value: Any, flag: str, example: str) -> str:
    text = str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not QUANTITY.fullmatch(text) or not re.search(r"[1-9]", text):
        raise ConfigError(
            f"{flag}={value!r} is not a positive Kubernetes quantity; give e.g. {example} "
            "(suffixes Ki Mi Gi Ti, k M G T, m = thousandths)"
        )
    return text


def pod_resources(cpu: Any, memory: Any, gpus: Any) -> dict[str, dict[str, Any]]:
    amounts: dict[str, Any] = {}
    if cpu is not None:
        amounts["cpu"] = quantity(cpu, "--cpu", "--cpu 4 or --cpu 500m")
    if memory is not None:
        amounts["memory"] = quantity(memory, "--memory", "--memory 8Gi")
    out: dict[str, dict[str, Any]] = {}
    if amounts:
        # Requests equal to limits: the Guaranteed QoS class, evicted last under node pressure.
        out["requests"] = dict(amounts)
        out["limits"] = dict(amounts)
    if check_count(gpus, "--gpus"):
        # A quantity string like cpu and memory (the Kubernetes API's type for every resource amount).
        out.setdefault("limits", {})[GPU_RESOURCE] = str(gpus)
    return out


def check_mount_path(path: Any) -> str:
    if (
        not isinstance(path, str)
        or not path.startswith("/")
        or ":" in path
        or posixpath.normpath(path) == "/"
    ):
        raise ConfigError(
            f"--mount-path={path!r} must be an absolute directory other than / and without ':'; "
            f"give e.g. --mount-path {DEFAULT_MOUNT}"
        )
    return posixpath.normpath(path)


def mapping(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(
            f"TFJob {where}={value!r} is missing or not a mapping; "
            "render the TFJob with --render kubeflow"
        )
    return value


def check_run_policy(policy: Any) -> None:
    if policy is None:
        raise ConfigError(
            "TFJob spec.runPolicy is missing; add runPolicy: {backoffLimit: 3, cleanPodPolicy: Running} "
            "(the Kubeflow SDK refuses a TFJob without it)"
        )
    policy = mapping(policy, "spec.runPolicy")
    clean = policy.get("cleanPodPolicy")
    if clean is not None and clean not in CLEAN_POD_POLICIES:
        raise ConfigError(
            f"TFJob spec.runPolicy.cleanPodPolicy={clean!r} is not one of "
            f"{', '.join(CLEAN_POD_POLICIES)}; use Running (keeps the logs of finished pods)"
        )
    limit = policy.get("backoffLimit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ConfigError(f"TFJob spec.runPolicy.backoffLimit={limit!r} must be an integer >= 0")


def check_replica(role: str, spec: Any) -> int:
    where = f"spec.tfReplicaSpecs.{role}"
    if role not in OPERATOR_REPLICA_TYPES:
        raise ConfigError(
            f"TFJob {where}: replica type {role!r} is unknown; "
            f"valid types: {', '.join(OPERATOR_REPLICA_TYPES)}"
        )
    spec = mapping(spec, where)
    replicas = spec.get("replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ConfigError(f"TFJob {where}.replicas={replicas!r} must be an integer >= 0")
    policy = spec.get("restartPolicy")
    if policy not in OPERATOR_RESTART_POLICIES:
        raise ConfigError(
            f"TFJob {where}.restartPolicy={policy!r} is not one of "
            f"{', '.join(OPERATOR_RESTART_POLICIES)}; use ExitCode (retries exits 128-255, "
            "e.g. 143 preemption) or OnFailure"
        )
    pod = mapping(
        mapping(spec.get("template"), f"{where}.template").get("spec"), f"{where}.template.spec"
    )
    containers = pod.get("containers")
    if not isinstance(containers, list) or not all(isinstance(c, dict) for c in containers):
        raise ConfigError(
            f"TFJob {where}.template.spec.containers={containers!r} must be a list of containers"
        )
    named = [c for c in containers if c.get("name") == CONTAINER_NAME]
    if len(named) != 1:
        names = [c.get("name") for c in containers]
        raise ConfigError(
            f"TFJob {where} has {len(named)} containers named {CONTAINER_NAME!r} (names: {names}); "
            "the operator sets TF_CONFIG in, and reads the exit code of, the container of that "
            "name only: give exactly one container that name"
        )
    for c in containers:
        if not c.get("image"):
            raise ConfigError(f"TFJob {where} container {c.get('name')!r} has no image; set image")
    ports = [
        p for p in named[0].get("ports") or [] if isinstance(p, dict) and p.get("name") == PORT_NAME
    ]
    if [p.get("containerPort") for p in ports] != [PORT]:
        raise ConfigError(
            f"TFJob {where} container {CONTAINER_NAME!r} ports named {PORT_NAME!r}: "
            f"{[p.get('containerPort') for p in ports]}; give exactly one, "
            f"{{name: {PORT_NAME}, containerPort: {PORT}}} (the port TF_CONFIG addresses use)"
        )
    return replicas
