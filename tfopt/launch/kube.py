"""Kubernetes: a Kubeflow ``TFJob`` (training operator v1, ``kubeflow.org/v1``) for a tfopt command.

:func:`render_tfjob` is a pure function (no TensorFlow import) that ``tfopt launch --render
kubeflow`` prints: one replica spec per role, a shared run directory, restart and clean-pod
policies matched to tfopt's exit codes, and a NetworkPolicy admitting only the job's own pods.
The job's semantics: docs/kubernetes.md.
"""

from __future__ import annotations

import argparse
import posixpath
from typing import Any

from tfopt.config import DATA_SERVICE_ENV
from tfopt.core.errors import ConfigError
from tfopt.core.specs import STAGES  # the tfopt commands that take -o/--output
from tfopt.launch.kube_checks import (  # noqa: F401  (check_tfjob: part of this module's API)
    API_VERSION,
    CLEAN_POD_POLICIES,
    CONTAINER_NAME,
    DATA_WORKER_PORT,
    DEFAULT_CLAIM,
    DEFAULT_MOUNT,
    DEFAULT_NAME,
    DISPATCHER_PORT,
    DNS1035,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    GPU_RESOURCE,
    ISTIO_INJECT,
    JOB_LABEL,
    KIND,
    PORT,
    PORT_NAME,
    RENDER_TARGETS,
    RESTART_POLICIES,
    ROLE_LABEL,
    VOLUME_NAME,
    check_choice,
    check_command,
    check_count,
    check_counts,
    check_dns,
    check_host_names,
    check_image,
    check_mount_path,
    check_tfjob,
    pod_resources,
)
from tfopt.launch.kube_data import data_service_target, render_data_service


def add_render_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Adds the ``--render kubeflow`` options to the launcher's parser.

    The task counts come from the launcher's own ``--chief``, ``--workers``, ``--ps`` and
    ``--evaluator``; they are not added here.

    Args:
        parser: The ``python -m tfopt.launch`` argument parser.

    Returns:
        The argument group "Kubernetes (--render kubeflow)".
    """
    g = parser.add_argument_group(
        "Kubernetes (--render kubeflow)",
        "print a Kubeflow TFJob (kubeflow.org/v1) that runs the command, instead of running "
        "it; see docs/kubernetes.md",
    )
    g.add_argument("--render", choices=RENDER_TARGETS, help="print the TFJob YAML and exit")
    g.add_argument("--image", help="container image with tfopt installed (required with --render)")
    g.add_argument(
        "--name",
        default=DEFAULT_NAME,
        help="TFJob name: pods <name>-<role>-<i>, run directory <mount-path>/<name> "
        f"(default {DEFAULT_NAME})",
    )
    g.add_argument("--namespace", help="namespace of the TFJob (default: kubectl's current one)")
    g.add_argument(
        "--restart-policy",
        choices=RESTART_POLICIES,
        default="ExitCode",
        help="ExitCode: retry exits 128-255 (143 preemption, 138 lost peer, 137 kill), fail on 1-127 (default); "
        "OnFailure: restart any failure in place, up to --backoff-limit",
    )
    g.add_argument(
        "--backoff-limit",
        type=int,
        default=3,
        help="container restarts (OnFailure) before the job is marked failed (default 3)",
    )
    g.add_argument(
        "--clean-pod-policy",
        choices=CLEAN_POD_POLICIES,
        default="Running",
        help="pods deleted when the job ends: Running keeps finished pods' logs (default)",
    )
    g.add_argument("--cpu", help="CPU request and limit of every pod, e.g. 4 or 500m")
    g.add_argument("--memory", help="memory request and limit of every pod, e.g. 8Gi")
    g.add_argument(
        "--gpus",
        type=int,
        default=0,
        help=f"{GPU_RESOURCE} per chief, worker and evaluator pod (default 0)",
    )
    g.add_argument(
        "--volume-claim",
        default=DEFAULT_CLAIM,
        help="ReadWriteMany PersistentVolumeClaim for run directories and backups "
        f"(default {DEFAULT_CLAIM})",
    )
    g.add_argument(
        "--mount-path",
        default=DEFAULT_MOUNT,
        help=f"where the claim is mounted (default {DEFAULT_MOUNT})",
    )
    return g


def render_from_args(args: argparse.Namespace, command: list[str]) -> str:
    """Validates the launcher's arguments and returns the TFJob as YAML text.

    Args:
        args: The parsed launcher arguments: the options of :func:`add_render_arguments` plus
            the launcher's ``chief``, ``workers``, ``ps`` and ``evaluator``.
        command: The command after ``--``, run by every replica.

    Returns:
        The YAML of one ``kubeflow.org/v1`` TFJob, with ``--data-workers N`` the tf.data service
        beside it (:func:`render_data_service`), and the NetworkPolicy that admits only the
        job's own pods (:func:`render_network_policy`), for ``kubectl apply -f``.

    Raises:
        ConfigError: a missing ``--image``, an empty command, a bad name, count, quantity or
            path; one line naming the value, the rule and the fix.
    """
    import yaml  # only rendering needs it

    if args.render not in RENDER_TARGETS:
        raise ConfigError(
            f"--render={args.render!r} is not one of {', '.join(RENDER_TARGETS)}; use --render kubeflow"
        )
    if not args.image:
        raise ConfigError(
            "--render kubeflow needs --image: the container image with tfopt installed, "
            "e.g. --image registry.example.com/tfopt:1 (see docs/kubernetes.md)"
        )
    data_workers = getattr(args, "data_workers", 0)
    doc = render_tfjob(
        data_service=data_service_target(args.name) if data_workers else None,
        name=args.name,
        namespace=args.namespace,
        image=args.image,
        command=command,
        chief=args.chief,
        workers=args.workers,
        ps=args.ps,
        evaluator=getattr(args, "evaluator", False),
        restart_policy=args.restart_policy,
        backoff_limit=args.backoff_limit,
        clean_pod_policy=args.clean_pod_policy,
        cpu=args.cpu,
        memory=args.memory,
        gpus=args.gpus,
        volume_claim=args.volume_claim,
        mount_path=args.mount_path,
    )
    check_tfjob(doc)
    service = (
        render_data_service(
            name=args.name,
            namespace=args.namespace,
            image=args.image,
            data_workers=data_workers,
            cpu=args.cpu,
            memory=args.memory,
            volume_claim=args.volume_claim,
            mount_path=args.mount_path,
        )
        if data_workers
        else []
    )
    policy = render_network_policy(args.name, args.namespace)
    return yaml.safe_dump_all([doc, *service, policy], sort_keys=False, width=120)


def render_tfjob(
    *,
    name: str,
    image: str,
    command: list[str],
    chief: bool = False,
    workers: int = 2,
    ps: int = 0,
    evaluator: bool = False,
    namespace: str | None = None,
    restart_policy: str = "ExitCode",
    backoff_limit: int = 3,
    clean_pod_policy: str = "Running",
    cpu: str | None = None,
    memory: str | None = None,
    gpus: int = 0,
    volume_claim: str = DEFAULT_CLAIM,
    mount_path: str = DEFAULT_MOUNT,
    data_service: str | None = None,
) -> dict[str, Any]:
    """Builds a ``kubeflow.org/v1`` TFJob as a plain dict (see the module docstring for its semantics).

    Args:
        name: TFJob name, a DNS-1035 label: pods and Services are ``<name>-<role>-<i>``.
        image: Container image with tfopt installed.
        command: What every replica runs; a tfopt stage without ``-o`` gets ``-o <mount_path>/<name>``.
        chief: Add one ``Chief`` replica.
        workers: Number of ``Worker`` replicas.
        ps: Number of ``PS`` replicas (ParameterServerStrategy: needs a chief and workers).
        evaluator: Add one ``Evaluator`` replica.
        namespace: The TFJob's namespace; None leaves it to kubectl.
        restart_policy: ``ExitCode`` or ``OnFailure``, for every replica.
        backoff_limit: ``runPolicy.backoffLimit``.
        clean_pod_policy: ``runPolicy.cleanPodPolicy``: ``Running``, ``All`` or ``None``.
        cpu: CPU request and limit of every pod (a Kubernetes quantity), or None.
        memory: Memory request and limit of every pod, or None.
        gpus: ``nvidia.com/gpu`` limit of chief, worker and evaluator pods (ps pods get none).
        volume_claim: The shared PersistentVolumeClaim (ReadWriteMany) for run directories.
        mount_path: Where every replica mounts it.
        data_service: ``grpc://`` address of a tf.data service dispatcher (see
            :func:`data_service_target`), given to every replica as ``$TFOPT_DATA_SERVICE``:
            tfopt stages then read their training input through it.

    Returns:
        The TFJob: ``apiVersion``, ``kind``, ``metadata``, ``spec.runPolicy``, ``spec.tfReplicaSpecs``.

    Raises:
        ConfigError: any invalid argument, in one line.
    """
    command = check_command(command)
    check_image(image)
    _check_names(name, namespace, volume_claim)
    counts = check_counts(chief, workers, ps, evaluator)
    check_host_names(name, counts)
    _check_policies(restart_policy, clean_pod_policy, backoff_limit)
    resources = {role: pod_resources(cpu, memory, gpus if role != "PS" else 0) for role in counts}
    mount_path = check_mount_path(mount_path)
    run_command = job_command(command, mount_path, name)
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    specs = {
        role: _replica(
            n, restart_policy, image, run_command, resources[role], volume_claim, mount_path, name
        )
        for role, n in counts.items()
    }
    if data_service:
        for spec in specs.values():
            [container] = spec["template"]["spec"]["containers"]
            container["env"].append({"name": DATA_SERVICE_ENV, "value": data_service})
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "runPolicy": {"backoffLimit": backoff_limit, "cleanPodPolicy": clean_pod_policy},
            "tfReplicaSpecs": specs,
        },
    }


def _check_policies(restart_policy: str, clean_pod_policy: str, backoff_limit: int) -> None:
    """Refuses a restart or clean-pod policy the operator does not know, or a negative limit."""
    check_choice(restart_policy, "--restart-policy", RESTART_POLICIES)
    check_choice(clean_pod_policy, "--clean-pod-policy", CLEAN_POD_POLICIES)
    check_count(backoff_limit, "--backoff-limit")


def _check_names(name: str, namespace: str | None, volume_claim: str) -> None:
    """Refuses a TFJob name, namespace or claim name Kubernetes would refuse."""
    check_dns(
        name,
        "--name",
        DNS1035,
        63,
        "a DNS-1035 label (the operator's rule for TFJob names)",
        "lower-case letters, digits and '-', starting with a letter, e.g. --name mnist-ps",
    )
    if namespace is not None:
        check_dns(
            namespace,
            "--namespace",
            DNS1123_LABEL,
            63,
            "a DNS-1123 label",
            "lower-case letters, digits and '-', e.g. --namespace ml-team",
        )
    check_dns(
        volume_claim,
        "--volume-claim",
        DNS1123_SUBDOMAIN,
        253,
        "a PersistentVolumeClaim name (DNS-1123)",
        f"lower-case letters, digits, '-' and '.', e.g. --volume-claim {DEFAULT_CLAIM}",
    )


def job_command(command: list[str], mount_path: str, name: str) -> list[str]:
    """Returns the command every replica runs, its run directory on the shared volume.

    A tfopt stage (``python -m tfopt.train``, ``tfopt train``, ... for train, distill, optimize
    and export) without ``-o``/``--output`` gets ``-o <mount_path>/<name>``, so every replica
    and every restart uses the same run directory, where the chief keeps the backups all
    workers restore from. Other commands are returned unchanged.

    Raises:
        ConfigError: a tfopt stage whose ``-o`` is not under ``mount_path``.
    """
    if _tfopt_stage(command) is None:
        return list(command)
    output = _output_of(command)
    if output is None:
        cut = command.index("--") if "--" in command else len(command)
        return [*command[:cut], "-o", f"{mount_path}/{name}", *command[cut:]]
    normal = posixpath.normpath(output) if output else ""
    if not (normal == mount_path or normal.startswith(mount_path + "/")):
        raise ConfigError(
            f"-o {output!r} is not under --mount-path {mount_path}, the volume every replica shares; "
            f"backups must be on it: give -o {mount_path}/{name} or drop -o"
        )
    return list(command)


# -- validation helpers -------------------------------------------------------------------


def _tfopt_stage(command: list[str]) -> str | None:
    """The tfopt stage ``command`` runs (``python -m tfopt.train``, ``tfopt train``...), or None."""
    if posixpath.basename(command[0]) == "tfopt":
        return command[1] if len(command) > 1 and command[1] in STAGES else None
    if "-m" in command:
        module = command[command.index("-m") + 1 :][:2]
        if module and module[0].startswith("tfopt.") and module[0][len("tfopt.") :] in STAGES:
            return module[0][len("tfopt.") :]
        if module[:1] == ["tfopt"] and len(module) > 1 and module[1] in STAGES:
            return module[1]
    return None


def _output_of(command: list[str]) -> str | None:
    """The run directory a tfopt command names with ``-o``/``--output`` (or ``--set train.output_dir=``)."""
    args = command[: command.index("--")] if "--" in command else command
    for i, arg in enumerate(args):
        if arg in ("-o", "--output"):
            return args[i + 1] if i + 1 < len(args) else ""
        for prefix in ("--output=", "train.output_dir=", "--set=train.output_dir="):
            if arg.startswith(prefix):
                return arg[len(prefix) :]
        if arg.startswith("-o") and not arg.startswith("--"):
            return arg[2:]
    return None


def render_network_policy(name: str, namespace: str | None = None) -> dict[str, Any]:
    """A ``networking.k8s.io/v1`` NetworkPolicy admitting, into the job's pods, only the job's own pods.

    TensorFlow's gRPC servers have no authentication (TensorFlow's SECURITY.md): without it, any
    pod of the cluster could reach them. Egress is left open (data, image pulls). It takes effect
    where the cluster's network plugin enforces NetworkPolicies.

    Args:
        name: The TFJob's name (its pods carry ``tfopt.dev/job: <name>``).
        namespace: The TFJob's namespace; None leaves it to kubectl.
    """
    metadata: dict[str, Any] = {"name": f"{name}-only-own-pods"}
    if namespace is not None:
        metadata["namespace"] = namespace
    selector = {"matchLabels": {JOB_LABEL: name}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            "podSelector": selector,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {JOB_LABEL: name}}}]}],
        },
    }


def _replica(
    replicas: int,
    restart_policy: str,
    image: str,
    command: list[str],
    resources: dict,
    claim: str,
    mount_path: str,
    name: str,
) -> dict[str, Any]:
    # Fresh objects for every replica: a shared one would be dumped as YAML anchors and aliases.
    container = {
        "name": CONTAINER_NAME,
        "image": image,
        "command": list(command),
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": PORT_NAME, "containerPort": PORT}],
        "resources": {kind: dict(amounts) for kind, amounts in resources.items()},
        "volumeMounts": [{"name": VOLUME_NAME, "mountPath": mount_path}],
    }
    return {
        "replicas": replicas,
        "restartPolicy": restart_policy,
        "template": {
            "metadata": {"annotations": {ISTIO_INJECT: "false"}, "labels": {JOB_LABEL: name}},
            "spec": {
                "containers": [container],
                "volumes": [{"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": claim}}],
            },
        },
    }


# -- check_tfjob helpers ------------------------------------------------------------------
