"""The project's exceptions. Every message names the argument, its value and the fix.

The CLI turns any `SurpriseGateError` into a one-line message and a non-zero exit code.
"""


class SurpriseGateError(Exception):
    """Base class: a problem the user can fix. `str(err)` is the message shown to them."""

    exit_code = 2


class ConfigError(SurpriseGateError, ValueError):
    """A config value (flag, TOML key or env variable) is invalid."""


class InputError(SurpriseGateError, ValueError):
    """Bad user input: an empty question, a malformed file, a missing path."""


class BackendError(SurpriseGateError):
    """A backend could not be loaded or cannot do what was asked (e.g. trim)."""

    exit_code = 3


class BackendFault(BackendError):
    """The backend failed while a reply was being written (a server refused, broke off, went silent or
    answered an error). The loop ends the reply with what it had and the receipt says what happened.
    `kind` names the fault (e.g. "refused", "reset", "idle_timeout", "http_error", "truncated")."""

    def __init__(self, message: str, *, kind: str = "error", status: int | None = None) -> None:
        super().__init__(message)
        self.kind, self.status = kind, status


class MissingDependency(BackendError):
    """An optional extra is not installed; the message says which pip command fixes it."""


class ArmError(SurpriseGateError):
    """A grounding arm failed. The controller catches it and resumes unmodified."""

    exit_code = 4
