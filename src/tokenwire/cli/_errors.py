"""The CLI's own errors, mapped to exit codes in one place (``_app.main``).

CliError
 ├── UsageError   exit 2: bad arguments or configuration
 ├── NotFoundError     exit 1: the session (or other thing) does not exist
 └── CheckFailedError  exit 1: a verification found differences
"""


class CliError(Exception):
    """Base of the CLI's errors."""


class UsageError(CliError):
    """The command line or configuration is wrong."""


class NotFoundError(CliError):
    """What the command was asked about does not exist."""


class CheckFailedError(CliError):
    """A check ran and found differences."""
