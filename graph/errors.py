"""Errors the runtime raises at its edge, as values with a `code` clients can branch on."""

from __future__ import annotations


class SessionRejected(Exception):
    """A session could not be opened. `code`: session_limit_reached | server_shutting_down | ..."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class NodeFailure(Exception):
    """Raised by a node to end its session with a reason the client may see.

    Anything else a node raises ends the session too, as an internal error.
    """

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message
