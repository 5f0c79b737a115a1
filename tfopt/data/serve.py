"""A tf.data service server as a process of its own: the dispatcher or one worker.

``tfopt launch --data-workers N`` runs one dispatcher and N workers this way, beside the
training tasks (docs/data_service.md); a Kubernetes render runs the same commands as
Deployments::

    python -m tfopt.data.serve dispatcher --port 5050 --work-dir /tmp/dispatcher
    python -m tfopt.data.serve worker --dispatcher 10.0.0.2:5050 --host 10.0.0.3 --port 5051

The dispatcher keeps its state in ``--work-dir`` (fault-tolerant mode): started again there, it
picks up its jobs and the trainers go on. A worker is stateless; started again, it registers
anew and takes the next split (``distributed_epoch``) or starts its stream from the beginning
(``parallel_epochs``). Both run until they are signalled.
"""

from __future__ import annotations

import argparse
import sys

#: How often a worker reports to the dispatcher, and how long the dispatcher waits for a report
#: before it gives the worker's splits to the others: seconds, not TensorFlow's minutes, so that
#: a lost worker costs the trainers a short stall.
HEARTBEAT_MS = 1000
WORKER_TIMEOUT_MS = 5000


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m tfopt.data.serve``."""
    parser = argparse.ArgumentParser(
        prog="python -m tfopt.data.serve",
        description="Run a tf.data service dispatcher or worker until signalled.",
    )
    roles = parser.add_subparsers(dest="role", required=True)
    dispatcher = roles.add_parser("dispatcher", help="the server that hands out splits and jobs")
    dispatcher.add_argument("--port", type=int, required=True, help="port to listen on")
    dispatcher.add_argument(
        "--work-dir",
        default="",
        help="directory for the dispatcher's journal (fault-tolerant mode); empty: in memory only",
    )
    worker = roles.add_parser("worker", help="a server that runs the input pipelines")
    worker.add_argument("--dispatcher", required=True, help="HOST:PORT of the dispatcher")
    worker.add_argument("--port", type=int, required=True, help="port to listen on")
    worker.add_argument(
        "--host", default="localhost", help="the address trainers dial to reach this worker"
    )
    return parser


def serve(args: argparse.Namespace):
    """Starts the server ``args`` describe and returns it (running)."""
    from tfopt.core._keras import tf

    service = tf.data.experimental.service
    if args.role == "dispatcher":
        return service.DispatchServer(
            service.DispatcherConfig(
                port=args.port,
                work_dir=args.work_dir or None,
                fault_tolerant_mode=bool(args.work_dir),
                worker_timeout_ms=WORKER_TIMEOUT_MS,
            )
        )
    return service.WorkerServer(
        service.WorkerConfig(
            dispatcher_address=args.dispatcher,
            worker_address=f"{args.host}:{args.port}",
            port=args.port,
            heartbeat_interval_ms=HEARTBEAT_MS,
        )
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the server until the process is signalled."""
    args = build_parser().parse_args(argv)
    server = serve(args)
    print(f"tf.data service {args.role} listening on port {args.port}", flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
