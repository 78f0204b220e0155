"""The browser page (clients/web/index.html), served at `/` and `/playground` from package data.

Read through importlib.resources, so it is found in an installed wheel as in a checkout. The
page is static and holds no secret; auth.py leaves these two paths open so a browser can load it
(the page then authenticates its API calls itself).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

PAGE_PATHS = ("/", "/playground")


@lru_cache(maxsize=1)
def page_html() -> str:
    return (resources.files("clients") / "web" / "index.html").read_text(encoding="utf-8")


def add_page_routes(app: FastAPI) -> None:
    async def page() -> HTMLResponse:
        return HTMLResponse(page_html(), headers={"Cache-Control": "no-cache"})

    for path in PAGE_PATHS:
        app.add_api_route(path, page, methods=["GET"], include_in_schema=False)
