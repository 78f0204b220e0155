"""The browser page is served from package data at / and /playground, without a key."""

from __future__ import annotations

from importlib import resources

import httpx

from tests.conftest import running_server
from tests.webrtc.helpers import API_KEY, webrtc_profile


async def test_the_page_loads_without_a_key_while_the_api_still_needs_one():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            for path in ("/", "/playground"):
                page = await http.get(path)
                assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
                assert "oai-events" in page.text and "/v1/realtime/client_secrets" in page.text
            assert (await http.get("/v1/models")).status_code == 401
            assert (await http.post("/v1/realtime/calls", content="v=0", headers={"Content-Type": "application/sdp"})).status_code == 401


def test_the_page_is_package_data_of_the_clients_package():
    # read the way the server reads it, so it is found in an installed wheel too (pyproject: clients = ["web/*"])
    assert (resources.files("clients") / "web" / "index.html").read_text().startswith("<!doctype html>")
