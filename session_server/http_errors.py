"""OpenAI-shaped bodies for every status the app itself returns: 404 (no such route), 405 (no
such method on it), 400 (a path or query parameter FastAPI could not read) and 500 (a bug).

A 500 tells the client only that the server failed; the traceback goes to the server's log,
where a bug belongs. A client's mistake never reaches here: the routes refuse it with a coded 4xx.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from session_server.errors import openai_error_response

log = logging.getLogger("session_server")

_CODES = {404: "not_found", 405: "method_not_allowed"}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path})"
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return openai_error_response(exc.status_code, message, code=_CODES.get(exc.status_code), headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        first = errors[0] if errors else {}
        param = ".".join(str(part) for part in first.get("loc", ())[1:]) or None
        return openai_error_response(400, f"Invalid request: {first.get('msg', 'malformed')}", param=param, code="invalid_request")

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> Response:
        # Starlette re-raises after this response, so the traceback is still logged once.
        return openai_error_response(500, "The server had an error while processing your request.", "server_error", code="internal_error")
