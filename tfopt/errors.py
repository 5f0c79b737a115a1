"""Exception hierarchy: every user-facing failure is a TfoptError with a one-line message."""


class TfoptError(Exception):
    """Base class for errors a user can fix; CLIs print the message and exit 2."""


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
