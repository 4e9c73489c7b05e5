"""Errors that name the problem: the file, key or field, and what was expected versus what was found.

Every error a user can trigger with bad input derives from ``TrnModelsError`` and also from ``ValueError``
so callers that already catch ``ValueError`` keep working.
"""


class TrnModelsError(ValueError):
    """Base class for every user-facing trnmodels error."""


class ConfigError(TrnModelsError):
    """A model or runtime config is malformed, incomplete or unsupported."""


class ShardingError(TrnModelsError):
    """A parallel degree does not fit the model's shapes."""


class CheckpointError(TrnModelsError):
    """A checkpoint is missing keys, has unexpected keys, wrong shapes, or a damaged file."""


class InputError(TrnModelsError):
    """A request's inputs (token ids, lengths) do not fit the model."""


class BackendUnavailableError(TrnModelsError):
    """A kernel backend was forced but cannot run on this host or tensor."""


class NonFiniteOutputError(TrnModelsError):
    """A model produced NaN or inf (bad weights, or values past the dtype's range): never returned as a
    result."""
