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
    """For uvicorn's access logger, whose args are (client, method, path, http_version, status), and
    its error logger, which logs each WebSocket as (client, path): a resume's query carries its
    `resume_token`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(arg, str) and "/" in arg for arg in record.args):
            record.args = tuple(redact(arg) if isinstance(arg, str) and "/" in arg else arg for arg in record.args)
        return True


ACCESS_LOG_FILTER = SecretRedactingFilter()


def redact_access_log() -> None:
    """Install the filter (after uvicorn configured its logging; adding it twice is a no-op)."""
    logging.getLogger("uvicorn.access").addFilter(ACCESS_LOG_FILTER)
    logging.getLogger("uvicorn.error").addFilter(ACCESS_LOG_FILTER)
