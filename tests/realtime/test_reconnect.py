"""Issue 16 (11): a client that closed gets its slot back at once: a full server admits its reconnect."""

from __future__ import annotations

import pytest

from tests.conftest import running_server
from tests.realtime.client import API_KEY, raw_client
from tests.realtime.fakes import realtime_profile


@pytest.mark.parametrize("engines", [False, True], ids=["in-process", "engine-process"])
async def test_a_client_that_closed_can_reconnect_immediately_to_a_full_server(engines):
    profile = realtime_profile(limits={"max_sessions": 1})
    if engines:
        profile["compute"] = {"engines": 1}
    async with running_server(profile, api_key=API_KEY, engines=engines) as srv:
        for _ in range(10):  # the fuzz runs saw 7-29 refusals in ~100 churns
            async with raw_client(srv) as client:
                assert (await client.recv())["type"] == "session.created"
        async with raw_client(srv) as client:
            assert (await client.recv())["type"] == "session.created"


async def test_a_server_that_stays_full_still_refuses_with_session_limit_reached():
    async with running_server(realtime_profile(limits={"max_sessions": 1}), api_key=API_KEY) as srv:
        async with raw_client(srv) as first:
            await first.recv()
            async with raw_client(srv) as second:
                assert (await second.error())["code"] == "session_limit_reached"
