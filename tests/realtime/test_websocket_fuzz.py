"""Issue 16: hypothesis-generated client events over a live WebSocket (127.0.0.1, the fake graph).

After each fuzzed event a probe (`conversation.item.retrieve` of a missing item, with its own
event_id) must be answered: so the session is still alive and ordered, and every event before
the answer is checked to be a valid server event. A session the server ends (a fatal error) must
say so with `session.closed`; the next connection is admitted. Bounded: 2 batches of 60 events.
"""

from __future__ import annotations

import asyncio
import json

import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import running_server
from tests.realtime.client import API_KEY, MODEL
from tests.realtime.fakes import realtime_profile
from tests.realtime.test_protocol_fuzz import assert_valid_server_event, raw_texts


async def _fuzz(texts: list[str]) -> None:
    async with running_server(realtime_profile(limits={"max_sessions": 2}), api_key=API_KEY) as srv:
        url = f"{srv.ws_url}/v1/realtime?model={MODEL}"
        headers = {"Authorization": f"Bearer {API_KEY}"}
        pending = list(texts)
        while pending:
            async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
                assert json.loads(await ws.recv())["type"] == "session.created"
                while pending:
                    text = pending.pop(0)
                    probe = f"probe_{len(pending)}"
                    await ws.send(text)
                    await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": "item_missing", "event_id": probe}))
                    if not await _answered(ws, probe):
                        break  # the server ended this session (and said so): go on with a new one
        async with websockets.connect(url, additional_headers=headers) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"


async def _answered(ws, probe: str) -> bool:
    async with asyncio.timeout(20):
        while True:
            try:
                event = json.loads(await ws.recv())
            except websockets.ConnectionClosed:
                raise AssertionError("the server closed the socket without session.closed") from None
            assert_valid_server_event(event)
            if event["type"] == "session.closed":
                return False
            if event["type"] == "error" and event["error"].get("event_id") == probe:
                return True


@settings(max_examples=2, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(raw_texts, min_size=60, max_size=60))
def test_fuzzed_events_over_a_live_websocket_never_break_a_session_silently(texts):
    asyncio.run(_fuzz(texts))
