"""Local multi-process launcher: run one command as every task of a TF_CONFIG cluster.

Like ``accelerate launch`` or ``torchrun``, but for tf.distribute: each task gets its own
``TF_CONFIG`` on free loopback ports, and its output lines are prefixed with ``[worker:0]`` etc.

    python -m tfopt.launch --workers 2 -- python -m tfopt.train --set runtime.strategy=multi_worker_mirrored
    python -m tfopt.launch --chief --workers 2 --ps 1 -- python -m tfopt.train --set runtime.strategy=parameter_server

Job semantics:

* A ``chief`` or ``worker`` task that exits non-zero fails the job: the other tasks are
  stopped. Under ParameterServerStrategy (ps tasks) a ``worker`` may die without failing the job
  (the ClusterCoordinator carries on with the others); a ``ps`` task that dies fails it.
* Without ps tasks the job succeeds when every training task has exited 0; with ps tasks when
  the chief has. The servers that never exit by themselves (worker, ps, evaluator) are then
  stopped.
* ``--max-restarts K``: a job that failed with a retryable code (128 or more: killed by a signal,
  143 preempted, 138 lost a peer) is started again, all tasks on fresh ports, up to K times; the
  stages resume from their last backup. TensorFlow restarts jobs, it does not replace a task in
  place (the elastic-agent model). Codes 1-127 (bad input, a crash) are final, as under
  Kubernetes' ``ExitCode`` restart policy.
* SIGTERM (or SIGHUP, the terminal closing) to the launcher is passed on to every task as SIGTERM
  (each writes a backup at its next step and exits 143); the launcher then exits 143. A launcher
  killed outright takes its tasks along: each gets SIGTERM from the kernel when it dies
  (:func:`tfopt.core.children.die_with_parent`).
* ``--timeout S`` stops everything after S seconds and returns 124.
* A local cluster (``--host`` on the loopback, the default) runs in a private network namespace
  whose only interface is its own loopback (``unshare -n`` as root, ``unshare -rn`` for other
  users): TensorFlow servers listen on every interface, unauthenticated, whatever TF_CONFIG
  names, and this keeps them off the network. Where the kernel refuses a namespace the job runs
  as it is and its chief warns once. ``--isolate`` makes the namespace a requirement (an error
  where it cannot be made); ``--no-isolate`` leaves the servers on the host's network.
* ``--data-workers N`` starts a tf.data service beside the cluster: a dispatcher and N workers
  (``python -m tfopt.data.serve``) on free ports of ``--host``, up before the trainers, which
  read their training input through it (``$TFOPT_DATA_SERVICE``, ``data.service=launched``).
  A service task that exits is started again on its port (a dispatcher from its journal, losing
  nothing; a worker losing at most the rest of its split under ``distributed_epoch``), up to 5
  times; one that does not accept connections within 60 s stops the job with code 1.
* ``--hosts N --link RATE[,DELAY]`` runs the tasks on N simulated hosts (:mod:`tfopt.launch.hosts`):
  network namespaces with addresses of their own, joined by a ``tc``-shaped link, so TF_CONFIG
  names N machines; tasks are placed round-robin. Where namespaces cannot be made the job runs
  on the loopback, said in one line.
* ``--render kubeflow`` prints a Kubeflow ``TFJob`` for the same cluster and command instead of
  running it (see :mod:`tfopt.launch.kube` and docs/kubernetes.md).

Tasks are stopped with SIGTERM, then SIGKILL after ``--grace`` seconds, or at once on a second Ctrl-C.
"""

from tfopt.launch.cli import build_parser, main
from tfopt.launch.cluster import data_service_tasks, free_ports, isolation_prefix, make_cluster
from tfopt.launch.supervise import launch

__all__ = [
    "build_parser",
    "data_service_tasks",
    "free_ports",
    "isolation_prefix",
    "launch",
    "main",
    "make_cluster",
]
