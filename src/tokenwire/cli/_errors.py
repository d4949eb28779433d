"""The CLI's own errors, mapped to exit codes in one place (``_app.main``).

CliError
 ├── UsageError   exit 2: bad arguments or configuration
 ├── NotFoundError     exit 1: the session (or other thing) does not exist
 ├── CheckFailedError  exit 1: a verification found differences
 ├── UnreachableError  exit 1: the broker or the store did not answer within the bound
 └── Interrupted       exit 128 + signal: SIGINT (130) or SIGTERM (143) stopped the command
"""

import signal


class CliError(Exception):
    """Base of the CLI's errors."""


class UsageError(CliError):
    """The command line or configuration is wrong."""


class NotFoundError(CliError):
    """What the command was asked about does not exist."""


class CheckFailedError(CliError):
    """A check ran and found differences."""


class UnreachableError(CliError):
    """``what`` (``store``, ``NATS``) at ``url`` (without credentials) did not answer."""

    def __init__(self, what: str, url: str, cause: str) -> None:
        self.what = what
        self.url = url
        self.cause = cause
        super().__init__(f"{what} not reachable at {url}: {cause}")


class Interrupted(CliError):  # noqa: N818 - a state, like KeyboardInterrupt
    """A signal stopped the command; what it had committed stays, nothing half-written."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + the signal number."""
        return 128 + self.signum
