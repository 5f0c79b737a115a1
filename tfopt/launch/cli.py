"""``tfopt launch``'s command line: its flags, the refusals of flags the chosen mode ignores,
and the dispatch to running, simulated hosts or a Kubeflow render."""

from __future__ import annotations

import argparse
import os
import sys

from tfopt.core.children import ISOLATED_ENV
from tfopt.core.errors import ConfigError
from tfopt.launch import hosts as hosts_lib
from tfopt.launch import kube
from tfopt.launch.cluster import isolation
from tfopt.launch.supervise import check, launch, say


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``tfopt launch`` (its own flags, before ``--``)."""
    parser = argparse.ArgumentParser(
        prog="tfopt launch",
        description="Run a command as every task of a local tf.distribute cluster (one TF_CONFIG each), "
        "or print it as a Kubeflow TFJob.",
        epilog="example: python -m tfopt.launch --workers 2 --max-restarts 3 -- python -m tfopt.train "
        "--strategy multi_worker_mirrored --backup-every 50",
    )
    parser.add_argument("--workers", type=int, default=2, help="number of worker tasks (default 2)")
    parser.add_argument(
        "--ps", type=int, default=0, help="number of parameter-server tasks (needs --chief)"
    )
    parser.add_argument("--chief", action="store_true", help="add a chief task")
    parser.add_argument(
        "--evaluator",
        action="store_true",
        help="add an evaluator task: it evaluates each new backup while training runs",
    )
    parser.add_argument(
        "--data-workers",
        type=int,
        default=0,
        metavar="N",
        help="start a tf.data service beside the cluster, a dispatcher and N workers; the "
        "trainers read their training input through it (data.service=launched; default 0: none)",
    )
    parser.add_argument(
        "--hosts",
        type=int,
        default=0,
        metavar="N",
        help="run the tasks on N simulated hosts, network namespaces joined by a link (root; "
        "default 0: this host's loopback)",
    )
    parser.add_argument(
        "--link",
        metavar="RATE[,DELAY]",
        help="the simulated hosts' link: rate each way and one-way delay, e.g. 10gbit,0.5ms "
        "(tc; default: the veth's own speed)",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="K",
        help="restart a job that failed with a retryable code (>= 128) up to K times (default 0)",
    )
    parser.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the cluster in a private network namespace, off the network (default: when "
        "--host is the loopback and the kernel allows it; --isolate: always, or fail; "
        "--no-isolate: never)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="stop all tasks and exit 124 after S seconds"
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address written into the tasks' TF_CONFIG, the one peers dial (default 127.0.0.1); "
        "TensorFlow's servers listen on every interface whatever it is: on the loopback the "
        "cluster runs in a private network namespace (see --isolate)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="seconds between SIGTERM and SIGKILL (default 10: time to write a backup)",
    )
    kube.add_render_arguments(parser)
    return parser


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        cut = argv.index("--")
        own, command = argv[:cut], argv[cut + 1 :]
    else:
        own, command = argv, []
    return build_parser().parse_args(own), command


# Flags that only a local run reads, and flags that only the rendered Kubernetes job reads.
LOCAL_ONLY = (
    "--max-restarts",
    "--timeout",
    "--hosts",
    "--link",
    "--isolate",
    "--no-isolate",
    "--host",
    "--grace",
)
RENDER_ONLY = (
    "--image",
    "--name",
    "--namespace",
    "--restart-policy",
    "--backoff-limit",
    "--clean-pod-policy",
    "--cpu",
    "--memory",
    "--gpus",
    "--volume-claim",
    "--mount-path",
)


def _refuse_unused(own: list[str], render: bool) -> None:
    """Every launcher flag given applies to what runs: a local job or the rendered TFJob."""
    given = [t.split("=", 1)[0] for t in own if t.startswith("--")]
    unused = [f for f in given if f in (LOCAL_ONLY if render else RENDER_ONLY)]
    if not unused:
        return
    if render:
        raise ConfigError(
            f"{', '.join(unused)} apply to a local run, not to the rendered TFJob (Kubernetes "
            "restarts and stops pods itself: --restart-policy, --backoff-limit); drop "
            f"{'them' if len(unused) > 1 else 'it'}"
        )
    raise ConfigError(
        f"{', '.join(unused)} apply to --render kubeflow only; add --render kubeflow, or drop "
        f"{'them' if len(unused) > 1 else 'it'}"
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: ``python -m tfopt.launch [options] -- COMMAND ...``; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    args, command = _parse(argv)
    try:
        _refuse_unused(argv[: argv.index("--")] if "--" in argv else argv, bool(args.render))
        if args.render:
            sys.stdout.write(kube.render_from_args(args, command))
            return 0
        check(
            command,
            args.workers,
            args.ps,
            args.chief,
            args.timeout,
            args.host,
            args.max_restarts,
            args.data_workers,
        )
        hosts = _simulated_hosts(args.hosts, args.link)
        if hosts is not None:
            with hosts:
                return _launch_args(command, args, hosts)
        prefix = isolation(args.isolate, args.host)
        if prefix:
            os.environ[ISOLATED_ENV] = "1"
            os.execvp(prefix[0], [*prefix, sys.executable, "-m", "tfopt.launch", *argv])
        return _launch_args(command, args)
    except ConfigError as e:
        say(str(e))
        return 2


def _launch_args(command: list[str], args: argparse.Namespace, hosts=None) -> int:
    return launch(
        command,
        args.workers,
        ps=args.ps,
        chief=args.chief,
        timeout=args.timeout,
        host=args.host,
        grace=args.grace,
        max_restarts=args.max_restarts,
        evaluator=args.evaluator,
        data_workers=args.data_workers,
        hosts=hosts,
    )


def _simulated_hosts(count: int, link: str | None) -> hosts_lib.SimulatedHosts | None:
    """The simulated hosts ``--hosts``/``--link`` ask for; None (said in one line) where refused."""
    if not count:
        if link:
            raise ConfigError(
                f"--link={link!r} joins simulated hosts; add --hosts 2, or drop --link"
            )
        return None
    shaped = hosts_lib.parse_link(link) if link else None
    try:
        hosts = hosts_lib.SimulatedHosts(count, shaped)
    except hosts_lib.HostsUnavailable as e:
        say(f"{e}; running the job on this host's loopback instead")
        return None
    for note in hosts.notes:
        say(note)
    joined = f"a {shaped} link" if shaped else "the veth's own speed"
    say(
        f"{count} simulated hosts ({', '.join(hosts_lib.address(i) for i in range(count))}), "
        f"joined at {joined}"
    )
    return hosts
