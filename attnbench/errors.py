"""The one domain exception: the core raises it; the CLI maps it to a message and exit code."""

from __future__ import annotations


class AttnbenchError(Exception):
    """A problem the user can fix (bad input, unavailable device, unwritable folder).

    ``exit_code`` follows the usual CLI convention: 2 for usage errors.
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
