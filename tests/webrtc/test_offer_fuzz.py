"""Issue 16 #9: mutated SDP offers to `POST /v1/realtime/calls`.

Every offer gets a 201 or a 4xx in the OpenAI error shape, never a 5xx; a refused one leaves no
session, call or unretrieved task ("Task exception was never retrieved") behind. The mutations
are seeded: the same 150 offers every run, derived from a real aiortc offer (audio + data
channel), by deleting, duplicating, truncating or rewriting lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random

import httpx
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from session_server.webrtc.offer import PeerConnection
from tests.conftest import eventually, running_server, until_true
from tests.webrtc.helpers import API_KEY, calls_of, webrtc_profile

KEYS = ["a=setup:", "a=fingerprint:", "a=mid:", "a=group:", "m=", "a=ice-ufrag:", "a=ice-pwd:", "a=rtpmap:",
        "a=sctp-port:", "a=candidate:", "c=", "a=msid:", "a=ssrc:", "a=rtcp:", "a=extmap:"]
VALUES = ["", "x", "0", "-1", "99999999999", "active", "passive", "holdconn", "sha-1 00", "BUNDLE", "BUNDLE 7",
          "BUNDLE 1 0", "audio", "application 9 DTLS/SCTP 5000", "IN IP6 ::1", "IN IP4 999.1.1.1", "é", "\x00"]


async def real_offer() -> str:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction="sendrecv")
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


def without_application_line(sdp: str) -> str:
    return "".join(line for line in sdp.splitlines(keepends=True) if not line.startswith("m=application"))


def mutated(sdp: str, rng: random.Random) -> str:
    lines = sdp.strip().split("\r\n")
    index = rng.randrange(1, len(lines))
    operation = rng.choice(["delete", "duplicate", "truncate", "rewrite", "delete-key", "rewrite-key"])
    if operation == "delete":
        del lines[index]
    elif operation == "duplicate":
        lines.insert(index, lines[rng.randrange(1, len(lines))])
    elif operation == "truncate":
        lines[index] = lines[index][: rng.randrange(len(lines[index]) + 1)]
    elif operation == "rewrite":
        lines[index] += " " + rng.choice(VALUES)
    else:
        key = rng.choice(KEYS)
        keyed = [i for i, line in enumerate(lines) if line.startswith(key)]
        if keyed:
            at = rng.choice(keyed)
            if operation == "delete-key":
                del lines[at]
            else:
                lines[at] = key + rng.choice(VALUES)
    return "\r\n".join(lines) + "\r\n"


@contextlib.asynccontextmanager
async def unretrieved_task_errors():
    """Collect what the loop reports (an unretrieved task exception among it) during the block."""
    loop = asyncio.get_running_loop()
    reports: list[dict] = []
    # Garbage of earlier tests (their dead tasks, e.g. an HTTP client's on a closed loop) reports
    # now, to the previous handler: only what the block leaves behind is counted. An openai
    # client collected here schedules its `aclose()` on this loop (its `__del__`), which fails on
    # the closed loop it was made on: let those run and be collected too.
    gc.collect()
    await asyncio.sleep(0.05)
    gc.collect()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reports.append(context))
    try:
        yield reports
        await asyncio.sleep(0.1)  # a negative check: the block's tasks get a fixed while to end and fail
        gc.collect()  # a dead task reports its unretrieved exception when it is collected
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)


async def post_offer(http: httpx.AsyncClient, sdp: str) -> httpx.Response:
    reply = await http.post("/v1/realtime/calls", content=sdp, headers={"Content-Type": "application/sdp"})
    if reply.status_code == 201:
        await http.post(reply.headers["location"] + "/hangup")
    return reply


async def test_an_offer_without_its_application_line_is_refused_as_invalid_offer_without_a_traceback():
    offer = without_application_line(await real_offer())
    async with unretrieved_task_errors() as reports:
        async with running_server(webrtc_profile(), api_key=API_KEY) as server:
            async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
                reply = await post_offer(http, offer)
            assert reply.status_code == 400, reply.text
            error = reply.json()["error"]
            assert error["code"] == "invalid_offer" and "BUNDLE" in error["message"]
            assert not server.runtime.sessions and len(calls_of(server)) == 0
    assert reports == []


async def test_a_peer_connection_that_cannot_connect_leaves_no_unretrieved_task(caplog):
    # Past the route's checks: aiortc itself takes the broken offer, and its connect task fails.
    async with unretrieved_task_errors() as reports:
        pc = PeerConnection(RTCConfiguration(iceServers=[]))
        with caplog.at_level(logging.INFO, logger="session_server.webrtc"):
            await pc.setRemoteDescription(RTCSessionDescription(without_application_line(await real_offer()), "offer"))
            await eventually(lambda: any("could not connect" in r.getMessage() for r in caplog.records),
                             "the connect task to fail")
        with contextlib.suppress(AttributeError):  # aiortc's close trips on the same missing transport
            await pc.close()
    assert reports == []


async def test_150_seeded_offer_mutations_get_a_201_or_a_coded_4xx_and_leave_nothing_behind():
    base = await real_offer()
    rng = random.Random(16)
    offers = [mutated(base, rng) for _ in range(150)]
    statuses: set[int] = set()
    async with unretrieved_task_errors() as reports:
        async with running_server(webrtc_profile(), api_key=API_KEY) as server:
            async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30) as http:
                for offer in offers:
                    reply = await post_offer(http, offer)
                    statuses.add(reply.status_code)
                    assert reply.status_code == 201 or 400 <= reply.status_code < 500, (reply.status_code, reply.text, offer)
                    if reply.status_code != 201:
                        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
                        assert reply.json()["error"]["code"], reply.text
            await until_true(lambda: not server.runtime.sessions and len(calls_of(server)) == 0, timeout=30)
    assert {201, 400} <= statuses  # the mutations reach both sides
    assert reports == []


async def test_a_malformed_multipart_offer_gets_400_invalid_form():
    async with running_server(webrtc_profile(), api_key=API_KEY) as server:
        async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            reply = await http.post("/v1/realtime/calls", content=b"v=0", headers={"Content-Type": "multipart/form-data"})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["code"] == "invalid_form"
        assert not server.runtime.sessions
