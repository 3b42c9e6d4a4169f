"""The one family of errors the library raises. The CLI maps each to a line and an exit code."""

from __future__ import annotations


class EdgespecError(Exception):
    """Base class: `str(err)` is a complete, actionable one-line message for a user.

    Each subclass names its exit code in its header, `class X(EdgespecError, exit_code=N)`: a
    keyword it cannot leave out, so no new error silently exits 1 like the base.
    """

    exit_code = 1

    def __init_subclass__(cls, *, exit_code: int, **kwargs):
        super().__init_subclass__(**kwargs)
        # 0 is success, and from 126 up the shell's (126/127 cannot run, 128+N killed by signal N,
        # which the CLI uses itself for 130/143/129): a code there would read as something else.
        if not 1 <= exit_code <= 125:
            raise ValueError(f"{cls.__name__}: exit code {exit_code} is not in 1..125")
        cls.exit_code = exit_code

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ConfigError(EdgespecError, exit_code=2):
    """A value given by the user (flag, env var, config file) is invalid."""


class ModelNotFoundError(EdgespecError, exit_code=3):
    """A model name or path could not be resolved from any source."""


class ModelFileError(EdgespecError, exit_code=4):
    """A file exists but is not a usable GGUF (not GGUF, truncated, malformed)."""


class DownloadError(EdgespecError, exit_code=5):
    """Fetching a model failed (network, hash mismatch, size mismatch)."""


class IncompatibleModelsError(EdgespecError, exit_code=6):
    """The draft model cannot be used with the target (vocabulary mismatch)."""


class ContextError(EdgespecError, exit_code=7):
    """The prompt (plus what is asked of the model) does not fit the context."""


class BackendError(EdgespecError, exit_code=8):
    """llama.cpp refused an operation (load, decode, context creation)."""


class PlanError(EdgespecError, exit_code=9):
    """The models cannot be placed on this machine's memory."""


class InputError(EdgespecError, exit_code=2):
    """The user's input (prompt, file) is unusable: empty, invalid UTF-8, malformed."""
