"""The one family of errors the library raises. The CLI maps each to a line and an exit code."""

from __future__ import annotations


class EdgespecError(Exception):
    """Base class: `str(err)` is a complete, actionable one-line message for a user."""

    exit_code = 1

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ConfigError(EdgespecError):
    """A value given by the user (flag, env var, config file) is invalid."""

    exit_code = 2


class ModelNotFoundError(EdgespecError):
    """A model name or path could not be resolved from any source."""

    exit_code = 3


class ModelFileError(EdgespecError):
    """A file exists but is not a usable GGUF (not GGUF, truncated, malformed)."""

    exit_code = 4


class DownloadError(EdgespecError):
    """Fetching a model failed (network, hash mismatch, size mismatch)."""

    exit_code = 5


class IncompatibleModelsError(EdgespecError):
    """The draft model cannot be used with the target (vocabulary mismatch)."""

    exit_code = 6


class ContextError(EdgespecError):
    """The prompt (plus what is asked of the model) does not fit the context."""

    exit_code = 7


class BackendError(EdgespecError):
    """llama.cpp refused an operation (load, decode, context creation)."""

    exit_code = 8


class PlanError(EdgespecError):
    """The models cannot be placed on this machine's memory."""

    exit_code = 9


class InputError(EdgespecError):
    """The user's input (prompt, file) is unusable: empty, invalid UTF-8, malformed."""

    exit_code = 2
