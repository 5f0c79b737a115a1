"""Exception hierarchy: every user-facing failure is a TfoptError with a one-line message."""


class TfoptError(Exception):
    """Base class for errors a user can fix; CLIs print the message and exit with ``exit_code``."""

    exit_code = 2


class ConfigError(TfoptError, ValueError):
    """A configuration value, file or flag is invalid."""


class DataError(TfoptError):
    """A data source is missing, corrupted or does not match its manifest."""


class ClusterError(TfoptError):
    """TF_CONFIG or the cluster it describes is invalid or unreachable."""


class ModelError(TfoptError):
    """A model cannot be built, loaded or used as asked."""


class OptimizeError(ModelError):
    """A model cannot be optimized as asked (unsupported layer, technique, strategy or policy)."""


class TargetOutOfReach(OptimizeError):
    """A compression target lies beyond what the model allows.

    Attributes:
        nearest: The reachable value closest to the target, in the target's unit.
    """

    def __init__(self, message: str, nearest: float):
        super().__init__(message)
        self.nearest = nearest


class TrainingError(TfoptError):
    """Training cannot go on as configured (e.g. the loss stays NaN after every roll-back)."""


class Preempted(TfoptError):
    """SIGTERM stopped the run after it wrote a backup; rerunning the command resumes it.

    Exit code 143 (128 + SIGTERM) marks "restart me" to the launcher and to Kubernetes'
    ``ExitCode`` restart policy, which treats codes 1-127 as permanent failures.
    """

    exit_code = 143


class PeerLost(TfoptError):
    """A multi-worker job lost a peer task (killed, preempted, out of memory, node gone).

    Exit code 138: retryable for the launcher and for Kubernetes' ``ExitCode`` restart policy
    (128-255); the restarted job resumes from the last backup.
    """

    exit_code = 138
