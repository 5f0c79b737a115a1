"""tf.data service: real in-process dispatcher and workers on loopback, small data.

The servers listen on every interface while a test runs (TensorFlow has no bind address for
them); every target the tests use is localhost. A silent hang (a reader of a dead service
retries for ever) becomes a test failure through the per-test timeout.
"""

import collections
import dataclasses
import hashlib
import socket

from tfopt.core._keras import tf

import pytest

from tfopt import config as C
from tfopt.config import DataConfig
from tfopt.core.errors import ConfigError, DataError
from tfopt.data import build, parse_fn, prepare, service

pytestmark = pytest.mark.timeout(180)

N = 1000
BATCH = 20


@pytest.fixture(scope="module")
def svc():
    """A dispatcher and 2 workers, stopped once every test's reads are over."""
    with service.start_local(num_workers=2) as running:
        yield running


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """400 training records of real 8x8 digits in 4 TFRecord shards: 20 batches per pass."""
    cfg = DataConfig(
        dataset="digits",
        data_dir=str(tmp_path_factory.mktemp("digits")),
        limit=400,
        num_shards=4,
        global_batch_size=BATCH,
        shuffle_buffer=100,
    )
    return cfg, prepare(cfg)


def records(batches):
    """Fingerprints (image bytes + label) of the records in ``(images, labels)`` batches, per batch."""
    return [
        tuple(
            hashlib.sha1(image.tobytes() + bytes([int(label)])).hexdigest()
            for image, label in zip(images.numpy(), labels.numpy())
        )
        for images, labels in batches
    ]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- service semantics on a plain dataset ------------------------------------------------------


@pytest.mark.slow
def test_distributed_epoch_produces_every_element_once(svc):
    ds = service.distribute(
        tf.data.Dataset.range(N), svc.target, "distributed_epoch", job_name="range-dynamic"
    )
    got = sorted(int(x) for x in ds.as_numpy_iterator())
    assert got == list(range(N))


@pytest.mark.slow
def test_parallel_epochs_produces_every_element_once_per_worker(svc):
    ds = service.distribute(
        tf.data.Dataset.range(N), svc.target, "parallel_epochs", job_name="range-off"
    )
    got = collections.Counter(int(x) for x in ds.as_numpy_iterator())
    assert got == collections.Counter({i: 2 for i in range(N)})


@pytest.mark.slow
def test_a_finished_job_name_gives_nothing_to_a_later_consumer(svc):
    first = service.distribute(
        tf.data.Dataset.range(10), svc.target, "distributed_epoch", job_name="reused"
    )
    assert len(list(first)) == 10
    again = service.distribute(
        tf.data.Dataset.range(10), svc.target, "distributed_epoch", job_name="reused"
    )
    assert list(again) == []  # why job names must be unique per run (service.job_name)


# -- the tfopt pipeline through the service -----------------------------------------------------


@pytest.mark.slow
def test_pipeline_pass_through_service_is_exactly_the_split(svc, digits):
    cfg, info = digits
    files = info.splits["train"].files
    local = build(files, parse_fn(info, "train"), cfg, training=False, batch_size=BATCH)
    expected = sorted(r for batch in records(local) for r in batch)
    labels = collections.Counter(int(y) for _, ys in local for y in ys.numpy())
    served_cfg = dataclasses.replace(cfg, service=svc.target, service_mode="distributed_epoch")
    # One finite pass; the 4 files are the splits the dispatcher hands to the 2 workers.
    served = service.maybe_distribute(
        build(files, parse_fn(info, "train"), cfg, training=False, batch_size=BATCH),
        served_cfg,
        training=True,
        job_name="digits-pass",
    )
    batches = list(served)  # one iteration: one job
    got = sorted(r for batch in records(batches) for r in batch)
    got_labels = collections.Counter(int(y) for _, ys in batches for y in ys.numpy())
    assert len(expected) == info.splits["train"].num_records == 400
    assert got == expected
    assert got_labels == labels


def test_training_stream_distributed_epoch_splits_passes(svc, digits):
    cfg, info = digits
    stream = build(
        info.splits["train"].files,
        parse_fn(info, "train"),
        cfg,
        training=True,
        batch_size=BATCH,
        num_records=400,
    )
    served_cfg = dataclasses.replace(cfg, service=svc.target, service_mode="distributed_epoch")
    ds = service.maybe_distribute(
        stream, served_cfg, training=True, job_name="digits-stream-dynamic"
    )
    batches = records(ds.take(3 * 20))  # three passes' worth; each pass is produced by one worker
    seen = collections.Counter(r for batch in batches for r in batch)
    assert len(set(batches)) == len(batches)  # no batch twice: every pass is produced once
    assert len(seen) == 400 and sum(seen.values()) == 3 * 400


@pytest.mark.slow
def test_training_stream_parallel_epochs_repeats_batches_per_worker(svc, digits):
    # Why local_target starts one worker (and several want distributed_epoch): a seeded stream is the same on
    # every worker, so the trainer receives each batch once per worker.
    cfg, info = digits
    cfg = dataclasses.replace(cfg, deterministic=True)  # the same record order on both workers
    stream = build(
        info.splits["train"].files,
        parse_fn(info, "train"),
        cfg,
        training=True,
        batch_size=BATCH,
        num_records=400,
    )
    served_cfg = dataclasses.replace(cfg, service=svc.target, service_mode="parallel_epochs")
    ds = service.maybe_distribute(
        stream.take(2 * 20), served_cfg, training=True, job_name="digits-stream-off"
    )
    batches = collections.Counter(records(ds))
    assert len(batches) == 2 * 20 and set(batches.values()) == {2}


def test_maybe_distribute_leaves_evaluation_and_service_off_alone(digits):
    cfg, _ = digits
    ds = tf.data.Dataset.range(3)
    assert service.maybe_distribute(ds, cfg, training=True, job_name="off") is ds
    dead = dataclasses.replace(cfg, service=f"grpc://localhost:{closed_port()}")
    assert (
        service.maybe_distribute(ds, dead, training=False, job_name="eval") is ds
    )  # not even a connect


# -- resolve, check, job names ----------------------------------------------------------------


@pytest.mark.slow
def test_resolve_off_and_local():
    assert service.resolve(DataConfig()) is None
    target = service.resolve(DataConfig(service="local"))
    assert target.startswith("grpc://localhost:")
    assert service.resolve(DataConfig(service="local")) == target  # started once per process
    got = sorted(
        int(x)
        for x in service.distribute(
            tf.data.Dataset.range(5), target, "parallel_epochs", job_name="local-singleton"
        )
    )
    assert got == [0, 1, 2, 3, 4]  # one local worker: no duplicates in parallel_epochs


def test_resolve_dead_address_is_a_fast_one_line_error(monkeypatch):
    # Fast by its mechanism, not by a clock a loaded machine can stretch: one connection attempt,
    # bounded by the connect timeout, that a closed port refuses at once (no retry, no timeout).
    attempts = []
    connect = socket.create_connection

    def counted(address, timeout=None, *args, **kwargs):
        attempts.append((address, timeout))
        return connect(address, timeout, *args, **kwargs)

    monkeypatch.setattr(service.socket, "create_connection", counted)
    port = closed_port()
    address = f"grpc://localhost:{port}"
    with pytest.raises(DataError) as err:
        service.resolve(DataConfig(service=address))
    assert attempts == [(("localhost", port), service.CONNECT_TIMEOUT)]
    message = str(err.value)
    assert "Connection refused" in message and "timed out" not in message, message
    assert address in message and "local" in message and "\n" not in message


def test_resolve_rejects_a_malformed_address():
    with pytest.raises(ConfigError, match="grpc://HOST:PORT"):
        service.resolve(DataConfig(service="grpc://localhost:notaport"))


def test_distribute_rejects_unknown_mode_and_empty_job_name():
    ds = tf.data.Dataset.range(3)
    with pytest.raises(ConfigError, match="parallel_epochs, distributed_epoch"):
        service.distribute(ds, "grpc://localhost:1", "one_epoch", job_name="x")
    with pytest.raises(ConfigError, match="job_name"):
        service.distribute(ds, "grpc://localhost:1", "parallel_epochs", job_name="")


def test_check_refuses_determinism_and_local_across_processes():
    service.check(C.from_dict({"runtime": {"deterministic": True}}))  # no service: fine
    service.check(C.from_dict({"data": {"service": "local"}, "runtime": {"strategy": "mirrored"}}))
    with pytest.raises(ConfigError) as err:
        service.check(
            C.from_dict({"data": {"service": "local"}, "runtime": {"deterministic": True}})
        )
    message = str(err.value)
    assert "data.service='local'" in message and "deterministic" in message and "\n" not in message
    with pytest.raises(ConfigError, match="grpc://HOST:PORT"):
        service.check(
            C.from_dict(
                {"data": {"service": "local"}, "runtime": {"strategy": "multi_worker_mirrored"}}
            )
        )


def test_job_names():
    remote = DataConfig(service="grpc://data:5050")
    assert service.job_name("train", "train", "abc123", remote) == service.job_name(
        "train", "train", "abc123", remote
    )
    assert "abc123" in service.job_name("train", "train", "abc123", remote)
    local = DataConfig(service="local")
    assert service.job_name("train", "train", "abc123", local) != service.job_name(
        "train", "train", "abc123", local
    )


@pytest.mark.slow
def test_the_local_service_says_its_ports_are_open_unless_isolated(capfd, monkeypatch):
    from tfopt.core import log
    from tfopt.data.service import LocalService

    log.configure("tfopt")  # as a command line does
    monkeypatch.delenv("TFOPT_ISOLATED", raising=False)
    with LocalService(1) as svc:
        port = svc.target.rpartition(":")[2]
    err = capfd.readouterr().err
    assert (
        f"tf.data service (dispatcher port {port} and 1 worker port(s)) listens on every network interface"
        in err
    )
    monkeypatch.setenv("TFOPT_ISOLATED", "1")  # inside tfopt.launch --isolate
    with LocalService(1):
        pass
    assert "listens on every network interface" not in capfd.readouterr().err
