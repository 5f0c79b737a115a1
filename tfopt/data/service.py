"""tf.data service: training input prepared by dispatcher-managed workers instead of the trainer.

``data.service`` is ``""`` (the trainer's own pipeline), ``"local"`` (an in-process dispatcher and
worker), ``"grpc://HOST:PORT"`` (an existing dispatcher) or ``"launched"`` (the dispatcher that
``tfopt launch --data-workers N`` started beside the trainers; the default in its tasks). ``maybe_distribute`` hands a training
pipeline to the service as its last step before ``prefetch``; evaluation never goes through it.
Processing modes, shared jobs, determinism, lifetime and security: docs/data_service.md.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from urllib.parse import urlsplit

from tfopt.core._keras import tf

from tfopt.config import (
    DATA_SERVICE_ENV,
    LAUNCHED_SERVICE,
    SERVICE_MODES,
    DataConfig,
    RunConfig,
)
from tfopt.core.children import ISOLATED_ENV
from tfopt.core.errors import ConfigError, DataError
from tfopt.core.specs import STRATEGIES

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0  # seconds a remote dispatcher has to accept a TCP connection
LOCAL_WORKERS = 1  # see the module docstring: more in-process workers add memory, not compute

_service = tf.data.experimental.service
_POLICIES = {
    "parallel_epochs": _service.ShardingPolicy.OFF,
    "distributed_epoch": _service.ShardingPolicy.DYNAMIC,
}
_lock = threading.Lock()
_local: LocalService | None = None
_jobs: list[str] = []


class LocalService:
    """An in-process dispatcher and its workers; a context manager that stops them on exit.

    Args:
        num_workers: Worker servers to start (>= 1).

    Attributes:
        target: ``grpc://localhost:PORT``, the dispatcher to give ``distribute``.
        dispatcher: The ``tf.data.experimental.service.DispatchServer``.
        workers: The ``WorkerServer`` objects.
    """

    def __init__(self, num_workers: int):
        if num_workers < 1:
            raise ConfigError(
                f"num_workers={num_workers} must be >= 1; give a positive number of workers"
            )
        self.dispatcher = _service.DispatchServer(_service.DispatcherConfig(port=0))
        address = self.dispatcher.target.split("://", 1)[1]
        self.workers = [
            _service.WorkerServer(_service.WorkerConfig(dispatcher_address=address, port=0))
            for _ in range(num_workers)
        ]
        self.target = self.dispatcher.target
        self.stopped = False
        if not os.environ.get(ISOLATED_ENV):  # tfopt.launch --isolate: a private network namespace
            log.warning(
                f"the in-process tf.data service (dispatcher port {self.target.rpartition(':')[2]} "
                f"and {num_workers} worker port(s)) listens on every network interface, without authentication; "
                "run on a trusted network, or under tfopt launch --isolate"
            )

    def stop(self) -> None:
        """Stops the workers, then the dispatcher (idempotent).

        Stop only when no dataset reads from this service any more: a reader left behind keeps
        retrying, without an error.
        """
        if self.stopped:
            return
        for worker in self.workers:
            worker.stop()
        self.dispatcher.stop()
        self.stopped = True

    def __enter__(self) -> LocalService:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_local(num_workers: int = 2) -> LocalService:
    """Starts an in-process tf.data service: a dispatcher and ``num_workers`` workers on free ports.

    Args:
        num_workers: Worker servers to start.

    Returns:
        The running service; ``with start_local() as svc:`` stops it at the end of the block.

    Raises:
        ConfigError: ``num_workers`` < 1.
    """
    return LocalService(num_workers)


def local_target(num_workers: int = LOCAL_WORKERS) -> str:
    """Returns the target of this process's local service, starting it on first use.

    The service lives until the process ends (see the module docstring); a later call with
    another ``num_workers`` returns the running service unchanged.
    """
    global _local
    with _lock:
        if _local is None or _local.stopped:
            _local = start_local(num_workers)
        return _local.target


def _address(target: str) -> tuple[str, int]:
    parts = urlsplit(target)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "grpc" or not parts.hostname or port is None:
        raise ConfigError(
            f"data.service={target!r} is not valid; give grpc://HOST:PORT, local, or nothing (off)"
        )
    return parts.hostname, port


def check_dispatcher(target: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """Checks that something accepts TCP connections at a ``grpc://HOST:PORT`` dispatcher address.

    A cheap guard: an unreachable dispatcher would otherwise make the first read hang without a
    word. It does not prove that the server is a tf.data dispatcher, nor that it has workers.

    Raises:
        ConfigError: ``target`` is not ``grpc://HOST:PORT``.
        DataError: nothing answers within ``timeout`` seconds.
    """
    host, port = _address(target)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        reason = "timed out" if isinstance(e, socket.timeout) else (e.strerror or type(e).__name__)
        raise DataError(
            f"no tf.data dispatcher answers at data.service={target!r} ({reason} after "
            f"{timeout:g} s); start one there (docs/data_service.md), fix the address, or "
            f"use --data-service local"
        ) from None


def resolve(cfg: DataConfig, timeout: float = CONNECT_TIMEOUT) -> str | None:
    """Returns the dispatcher target ``data.service`` names, or None when the service is off.

    Args:
        cfg: The data config.
        timeout: Seconds a remote dispatcher has to accept a connection.

    Returns:
        None for ``""``; the local service's target for ``"local"`` (started on first use);
        the ``grpc://HOST:PORT`` address itself, or for ``"launched"`` the one in
        ``$TFOPT_DATA_SERVICE``, once it accepts connections.

    Raises:
        ConfigError: malformed address, or ``launched`` outside ``tfopt launch --data-workers``.
        DataError: a remote dispatcher does not answer.
    """
    if not cfg.service:
        return None
    if cfg.service == "local":
        return local_target()
    target = launched_target() if cfg.service == LAUNCHED_SERVICE else cfg.service
    check_dispatcher(target, timeout)
    return target


def launched_target() -> str:
    """The ``grpc://`` address of the dispatcher ``tfopt launch --data-workers N`` started.

    Raises:
        ConfigError: this process is not a task of such a launch (``$TFOPT_DATA_SERVICE`` unset).
    """
    target = os.environ.get(DATA_SERVICE_ENV, "")
    if not target:
        raise ConfigError(
            f"data.service={LAUNCHED_SERVICE!r} reads from the dispatcher that tfopt launch "
            f"--data-workers N starts, and ${DATA_SERVICE_ENV} is not set here; run under "
            "python -m tfopt.launch --data-workers N -- ..., or give grpc://HOST:PORT or local"
        )
    return target


def distribute(ds: tf.data.Dataset, target: str, mode: str, *, job_name: str) -> tf.data.Dataset:
    """Moves the production of ``ds`` to the tf.data service at ``target``.

    Everything ``ds`` does runs on the service workers; what is applied to the returned dataset
    runs in this process. Applying it registers ``ds`` with the dispatcher (an RPC).

    Args:
        ds: The dataset the workers produce, options included.
        target: ``grpc://HOST:PORT`` of a dispatcher (see ``resolve``).
        mode: ``parallel_epochs`` or ``distributed_epoch`` (see the module docstring).
        job_name: Consumers giving the same name share one job (see ``job_name``).

    Returns:
        A dataset of the elements the service produces, in the order they arrive.

    Raises:
        ConfigError: unknown ``mode`` or empty ``job_name``.
    """
    if mode not in _POLICIES:
        raise ConfigError(
            f"data.service_mode={mode!r} is not valid; choose one of {', '.join(SERVICE_MODES)}"
        )
    if not job_name:
        raise ConfigError(
            "job_name is empty; give a name shared by the trainers of one run (service.job_name)"
        )
    out = ds.apply(
        _service.distribute(processing_mode=_POLICIES[mode], service=target, job_name=job_name)
    )
    _jobs.append(job_name)
    return out


def maybe_distribute(
    ds: tf.data.Dataset, cfg: DataConfig, *, training: bool, job_name: str
) -> tf.data.Dataset:
    """``distribute`` a training dataset when ``data.service`` is set; otherwise ``ds`` unchanged.

    Call it as the last step of a training pipeline before ``prefetch`` (see the module
    docstring). Evaluation datasets (``training=False``) are always returned unchanged.

    Args:
        ds: The service-side dataset, identical on every trainer of the run.
        cfg: ``service`` and ``service_mode`` are read.
        training: Only training datasets go through the service.
        job_name: From ``job_name``; the same on every trainer of the run.

    Returns:
        The distributed dataset, or ``ds``.

    Raises:
        ConfigError: malformed ``data.service`` or unknown mode.
        DataError: a remote dispatcher does not answer.
    """
    target = resolve(cfg) if training else None
    if target is None:
        return ds
    return distribute(ds, target, cfg.service_mode, job_name=job_name)


def job_name(stage: str, split: str, fingerprint: str, cfg: DataConfig) -> str:
    """The job name of one run's ``split`` input: shared by its trainers, unused by other runs.

    A remote name depends only on what every trainer of the run knows alike (stage, split, the
    run's config fingerprint), so the trainers share one job. A rerun of the same config joins
    that job while the dispatcher keeps it (its endless stream continues). The local service
    belongs to one process, so its names also carry a random suffix: a second run in the same
    process starts a fresh stream.
    """
    name = f"tfopt-{stage}-{split}-{fingerprint}"
    return f"{name}-{uuid.uuid4().hex[:8]}" if cfg.service == "local" else name


def check(cfg: RunConfig) -> None:
    """Refuses settings the tf.data service cannot honour; call before TensorFlow starts.

    Raises:
        ConfigError: ``runtime.deterministic`` with a service, the local service with a
            strategy of several processes, or ``launched`` outside ``tfopt launch --data-workers``.
    """
    service = cfg.data.service
    if not service:
        return
    if service == LAUNCHED_SERVICE:
        launched_target()
    if cfg.runtime.deterministic:
        drop = (
            "launch without --data-workers"
            if service == LAUNCHED_SERVICE
            else "drop --data-service"
        )
        raise ConfigError(
            f"data.service={service!r} cannot honour runtime.deterministic=true: the service "
            "delivers batches in the order its workers finish them, so reruns and resumes "
            f"are not identical; {drop} or drop --deterministic"
        )
    if service == "local" and STRATEGIES.get(cfg.runtime.strategy).multi_process:
        raise ConfigError(
            f"data.service='local' cannot feed runtime.strategy={cfg.runtime.strategy!r}: each "
            "process would start a private service and train on the same stream; start a "
            "shared dispatcher and give grpc://HOST:PORT, or use --strategy mirrored"
        )


def jobs() -> tuple[str, ...]:
    """Names of the jobs this process has sent to a tf.data service, oldest first."""
    return tuple(_jobs)
