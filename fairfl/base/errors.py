"""Named errors, so that a notebook or a sweep fails with one message that says what is wrong."""


class FairFLError(Exception):
    """Base class of every error fairfl raises on purpose."""


class ConfigError(FairFLError, ValueError):
    """A parameter has a value that is not allowed; raised before any training starts."""


class DatasetNotFoundError(FairFLError, FileNotFoundError):
    """A dataset is neither in the data root, nor in a known offline copy, nor downloadable."""


class DataError(FairFLError, ValueError):
    """A dataset file is present but its contents are wrong: a checksum that is not the recorded
    one, or contents that cannot be trained on (blank, NaN, labels out of range)."""


class CacheError(FairFLError, OSError):
    """A run-cache entry or the results folder cannot be used: an unreadable or altered entry, a
    folder that cannot be written. The message names the folder and what to do."""


class WriteError(FairFLError, OSError):
    """A file cannot be written (disk full, read-only folder, no permission); the message names it."""


class TrainingDivergedError(FairFLError, FloatingPointError):
    """A client's loss or update became NaN/Inf; the run stops and the last checkpoint is kept."""


class RunFailedError(FairFLError, RuntimeError):
    """One or more runs of a sweep failed; the others are kept in the cache."""
