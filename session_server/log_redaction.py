"""Keys never reach the log. Keys go in headers, and a key sent in a query string
(`?api_key=...`) is refused, but uvicorn's access log prints each request's path with its query:
this filter masks the values of secret-looking parameters and anything shaped like a key."""

from __future__ import annotations

import logging
import re

_SECRET = re.compile(
    r"(?i)((?:^|[?&])[^=&]*(?:key|token|secret|auth|password)[^=&]*=)[^&]*"  # ?api_key=..., &token=...
    r"|\b(?:sk-|ek_)[A-Za-z0-9_\-]+"  # a server or ephemeral key anywhere else in the path
)


def redact(path: str) -> str:
    return _SECRET.sub(lambda match: (match.group(1) or "") + "[redacted]", path)


class SecretRedactingFilter(logging.Filter):
    """For uvicorn's access logger, whose args are (client, method, path, http_version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and len(record.args) >= 3 and isinstance(record.args[2], str):
            args = list(record.args)
            args[2] = redact(args[2])
            record.args = tuple(args)
        return True


ACCESS_LOG_FILTER = SecretRedactingFilter()


def redact_access_log() -> None:
    """Install the filter (after uvicorn configured its logging; adding it twice is a no-op)."""
    logging.getLogger("uvicorn.access").addFilter(ACCESS_LOG_FILTER)
