"""Kubernetes objects for a federated run: ``tfopt federated --render kubernetes``.

A pure function of the command line (no TensorFlow import): a Deployment and a Service for the
Flower SuperLink, a StatefulSet of SuperNodes (pod ``<name>-clients-i`` is ``partition-id=i``), a
Job that runs the same ``tfopt federated`` command against them (``--superlink``), and a
NetworkPolicy admitting into these pods only their own (Flower runs without TLS here). Every pod
mounts one ReadWriteMany claim at the same path: the Job writes the run there, with the
partitions the clients read and the spec the ServerApp reads. docs/federated.md says more.
"""

from __future__ import annotations

import shlex
from typing import Any

from tfopt.core.errors import ConfigError

#: What --render takes.
TARGETS = ("kubernetes",)
#: The SuperLink's port (Flower's default) and the label every pod of a run carries.
PORT = 8000
LABEL = "tfopt.dev/federated"
DEFAULT_NAME = "tfopt-federated"
DEFAULT_CLAIM = "tfopt-runs"
DEFAULT_MOUNT = "/runs"
#: The options of the render itself (not of the run), which the Job's command drops.
RENDER_OPTIONS = ("--render", "--image", "--name", "--namespace", "--volume-claim", "--mount-path")


def add_arguments(parser) -> None:
    """The ``--render kubernetes`` options of ``tfopt federated``."""
    g = parser.add_argument_group(
        "Kubernetes (--render kubernetes)",
        "print the Kubernetes objects that run this command on a cluster, instead of running it",
    )
    g.add_argument("--render", choices=TARGETS, help="print the objects' YAML and exit")
    g.add_argument("--image", help="container image with tfopt[federated] (required with --render)")
    g.add_argument(
        "--name",
        default=DEFAULT_NAME,
        help=f"prefix of every object's name (default {DEFAULT_NAME})",
    )
    g.add_argument("--namespace", help="the objects' namespace (default: kubectl's current one)")
    g.add_argument(
        "--volume-claim",
        default=DEFAULT_CLAIM,
        help=f"ReadWriteMany PersistentVolumeClaim every pod mounts (default {DEFAULT_CLAIM})",
    )
    g.add_argument(
        "--mount-path",
        default=DEFAULT_MOUNT,
        help=f"where the claim is mounted (default {DEFAULT_MOUNT})",
    )


def job_argv(argv: list[str], name: str, mount: str) -> list[str]:
    """The Job's ``tfopt federated`` arguments: the user's without the render options, on the
    SuperLink's Service, writing ``<mount>/<name>`` unless an output is given."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
            continue
        option = word.split("=", 1)[0]
        if option in RENDER_OPTIONS:
            skip = "=" not in word
            continue
        out.append(word)
    if not any(w.split("=", 1)[0] in ("-o", "--output") for w in out):
        out += ["-o", f"{mount.rstrip('/')}/{name}"]
    return [*out, "--superlink", f"{name}-superlink:{PORT}"]


def render(
    argv: list[str],
    clients: int,
    *,
    image: str | None,
    name: str = DEFAULT_NAME,
    namespace: str | None = None,
    claim: str = DEFAULT_CLAIM,
    mount: str = DEFAULT_MOUNT,
) -> list[dict[str, Any]]:
    """The objects that run ``tfopt federated ARGV`` on a cluster, with ``clients`` SuperNodes.

    Raises:
        ConfigError: no image, a name Kubernetes refuses, a relative mount path, or
            ``--superlink`` among the arguments (the objects start their own).
    """
    _check(argv, clients, image, name, mount)
    meta = {"namespace": namespace} if namespace else {}
    labels = {LABEL: name}
    node = (
        f"exec flower-supernode --insecure --superlink {name}-superlink:{PORT} --node-config "
        f'"partition-id=${{HOSTNAME##*-}} num-partitions={clients}"'
    )
    link = ["flower-superlink", "--insecure", "--host", "0.0.0.0", "--port", str(PORT)]
    link.append("--disable-runtime-dependency-installation")
    server = ["python", "-m", "tfopt.federated", *job_argv(argv, name, mount)]
    pods = _Pods(image, labels, claim, mount)
    return [
        _object("v1", "Service", f"{name}-superlink", meta, labels)
        | {"spec": {"selector": pods.labels("superlink"), "ports": [{"port": PORT}]}},
        _object("apps/v1", "Deployment", f"{name}-superlink", meta, labels)
        | {"spec": pods.controller("superlink", link, replicas=1)},
        _object("apps/v1", "StatefulSet", f"{name}-clients", meta, labels)
        | {
            "spec": pods.controller("clients", ["sh", "-c", node], replicas=clients)
            | {"serviceName": f"{name}-clients", "podManagementPolicy": "Parallel"}
        },
        # a failed attempt is run again: it resumes after the last finished round
        _object("batch/v1", "Job", name, meta, labels)
        | {"spec": {"backoffLimit": 3, "template": pods.template("server", server, "OnFailure")}},
        _object("networking.k8s.io/v1", "NetworkPolicy", f"{name}-only-own-pods", meta, {})
        | {
            "spec": {
                "podSelector": {"matchLabels": labels},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": labels}}]}],
            }
        },
    ]


def _check(argv: list[str], clients: int, image: str | None, name: str, mount: str) -> None:
    if not image:
        raise ConfigError(
            "--render kubernetes needs --image, a container image with tfopt[federated]"
        )
    if not _dns_label(f"{name}-clients-{clients - 1}"):
        raise ConfigError(
            f"--name {name!r} is not a Kubernetes name: lower-case letters, digits and '-', "
            "starting with a letter, at most 50 characters"
        )
    if not mount.startswith("/"):
        raise ConfigError(f"--mount-path {mount!r} must be absolute, e.g. /runs")
    if any(w.split("=", 1)[0] == "--superlink" for w in argv):
        raise ConfigError(
            "--superlink names a running SuperLink, and --render kubernetes starts its own; drop "
            "--superlink"
        )


def _object(api: str, kind: str, name: str, meta: dict, labels: dict) -> dict:
    return {
        "apiVersion": api,
        "kind": kind,
        "metadata": {"name": name, **({"labels": labels} if labels else {}), **meta},
    }


class _Pods:
    """Pod templates of one run: its image, its labels, the claim every pod mounts."""

    def __init__(self, image: str, labels: dict, claim: str, mount: str):
        self.image, self.run_labels, self.claim, self.mount = image, labels, claim, mount

    def labels(self, role: str) -> dict:
        return {**self.run_labels, f"{LABEL}-role": role}

    def template(self, role: str, command: list[str], restart: str = "Always") -> dict:
        container = {
            "name": role,
            "image": self.image,
            "command": command,
            "volumeMounts": [{"name": "runs", "mountPath": self.mount}],
        }
        if role == "superlink":
            container["ports"] = [{"containerPort": PORT}]
        volume = {"name": "runs", "persistentVolumeClaim": {"claimName": self.claim}}
        return {
            "metadata": {"labels": self.labels(role)},
            "spec": {"restartPolicy": restart, "containers": [container], "volumes": [volume]},
        }

    def controller(self, role: str, command: list[str], replicas: int) -> dict:
        return {
            "replicas": replicas,
            "selector": {"matchLabels": self.labels(role)},
            "template": self.template(role, command),
        }


def to_yaml(objects: list[dict]) -> str:
    """The objects as one multi-document YAML stream, with the command it came from on top."""
    import yaml

    job = next(o for o in objects if o["kind"] == "Job")
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    head = f"# kubectl apply -f - ; the run: {shlex.join(command)}\n"
    return head + yaml.safe_dump_all(objects, sort_keys=False)


def _dns_label(text: str) -> bool:
    import re

    return bool(re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", text))
