"""Kubernetes: the tf.data service of ``tfopt launch --render kubeflow --data-workers N`` (a
dispatcher Deployment and its Service, a Deployment of data workers), beside the TFJob that
:mod:`tfopt.launch.kube` renders. Pure functions, no TensorFlow import."""

from __future__ import annotations

from typing import Any

from tfopt.core.errors import ConfigError
from tfopt.launch.kube_checks import (
    DATA_WORKER_PORT,
    DEFAULT_CLAIM,
    DEFAULT_MOUNT,
    DISPATCHER_PORT,
    ISTIO_INJECT,
    JOB_LABEL,
    ROLE_LABEL,
    VOLUME_NAME,
    check_count,
    check_mount_path,
    pod_resources,
)

#: The command of the tf.data service's pods.
SERVE = ["python", "-m", "tfopt.data.serve"]


def data_service_target(name: str) -> str:
    """The ``grpc://`` address of job ``name``'s tf.data dispatcher: its Service, in-namespace."""
    return f"grpc://{name}-data-dispatcher:{DISPATCHER_PORT}"


def render_data_service(
    *,
    name: str,
    image: str,
    data_workers: int,
    namespace: str | None = None,
    cpu: str | None = None,
    memory: str | None = None,
    volume_claim: str = DEFAULT_CLAIM,
    mount_path: str = DEFAULT_MOUNT,
) -> list[dict[str, Any]]:
    """The tf.data service of ``tfopt launch --data-workers N`` as Kubernetes objects.

    A dispatcher Deployment (one pod, its journal on the shared volume so that a restarted pod
    resumes its jobs) and its Service ``<name>-data-dispatcher``, which the TFJob's replicas dial;
    a Deployment of N worker pods, each registering its pod IP. Kubernetes restarts any pod that
    dies, as the launcher does; the pods carry the job's label, so the job's NetworkPolicy admits
    them. They outlive the TFJob: ``kubectl delete -f`` the rendered file when the job is done.

    Args:
        name: The TFJob's name; the objects are ``<name>-data-dispatcher`` and ``<name>-data-worker``.
        image: Container image with tfopt installed.
        data_workers: Number of worker pods (>= 1).
        namespace: The objects' namespace; None leaves it to kubectl.
        cpu: CPU request and limit of every pod, or None.
        memory: Memory request and limit of every pod, or None.
        volume_claim: The shared PersistentVolumeClaim (the dispatcher's journal goes there).
        mount_path: Where the dispatcher mounts it.

    Returns:
        ``[dispatcher Deployment, dispatcher Service, worker Deployment]``.

    Raises:
        ConfigError: a bad count or quantity, or a name too long for the objects' names.
    """
    if check_count(data_workers, "--data-workers") < 1:
        raise ConfigError(
            f"--data-workers={data_workers} starts no tf.data service; give 1 or more, or drop it"
        )
    if len(f"{name}-data-dispatcher") > 63:
        raise ConfigError(
            f"--name={name!r} makes the Service name {name}-data-dispatcher longer than the 63 "
            f"characters Kubernetes allows: shorten --name to at most {63 - 16} characters"
        )
    metadata = {} if namespace is None else {"namespace": namespace}
    resources = pod_resources(cpu, memory, 0)
    mount_path = check_mount_path(mount_path)
    journal = f"{mount_path}/{name}/data-dispatcher"
    dispatcher = _deployment(
        f"{name}-data-dispatcher",
        name,
        1,
        [*SERVE, "dispatcher", "--port", str(DISPATCHER_PORT), "--work-dir", journal],
        DISPATCHER_PORT,
        image,
        resources,
        metadata,
        volume=(volume_claim, mount_path),
    )
    dispatcher["spec"]["strategy"] = {"type": "Recreate"}  # one journal, one writer
    worker = _data_worker(name, data_workers, image, resources, metadata)
    service = _dispatcher_service(name, metadata)
    return [dispatcher, service, worker]


def _data_worker(name: str, data_workers: int, image: str, resources, metadata) -> dict:
    """The Deployment of the tf.data service's worker pods, each registering its pod IP."""
    worker = _deployment(
        f"{name}-data-worker",
        name,
        data_workers,
        [
            *SERVE,
            "worker",
            "--dispatcher",
            f"{name}-data-dispatcher:{DISPATCHER_PORT}",
            "--host",
            "$(POD_IP)",
            "--port",
            str(DATA_WORKER_PORT),
        ],
        DATA_WORKER_PORT,
        image,
        resources,
        metadata,
    )
    worker["spec"]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    )
    return worker


def _dispatcher_service(name: str, metadata) -> dict:
    """The Service the TFJob's replicas and the data workers dial the dispatcher through."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{name}-data-dispatcher", **metadata},
        "spec": {
            "selector": {JOB_LABEL: name, ROLE_LABEL: "data-dispatcher"},
            "ports": [{"name": "grpc", "port": DISPATCHER_PORT, "targetPort": DISPATCHER_PORT}],
        },
    }
    return service


def _deployment(
    full_name: str,
    job: str,
    replicas: int,
    command: list[str],
    port: int,
    image: str,
    resources: dict,
    metadata: dict,
    volume: tuple[str, str] | None = None,
) -> dict[str, Any]:
    role = full_name[len(job) + 1 :]
    labels = {JOB_LABEL: job, ROLE_LABEL: role}
    container: dict[str, Any] = {
        "name": role,
        "image": image,
        "command": command,
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": "grpc", "containerPort": port}],
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 2},
        "resources": {kind: dict(amounts) for kind, amounts in resources.items()},
    }
    pod: dict[str, Any] = {"containers": [container]}
    if volume is not None:
        claim, mount_path = volume
        container["volumeMounts"] = [{"name": VOLUME_NAME, "mountPath": mount_path}]
        pod["volumes"] = [{"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": claim}}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": full_name, **metadata},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"annotations": {ISTIO_INJECT: "false"}, "labels": dict(labels)},
                "spec": pod,
            },
        },
    }
