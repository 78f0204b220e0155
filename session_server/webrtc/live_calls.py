"""OpenAI's Live API over WebRTC: `POST /v1/live/sessions` and `POST /v1/live/sessions/{id}/fork`.

    POST /v1/live/sessions                {session: {model, ...}, transport: {type: "webrtc", sdp}}
    POST /v1/live/sessions/{id}/fork      {session: {overrides}, transport: {type: "webrtc", sdp}}
        -> 201 {session: {id}, transport: {type: "webrtc", sdp: <the answer>}}  (JSON, as the SDK's
           `LiveCreateResponse` / `SessionForkResponse`)

A Live call is a GA call (call.py: the same peer connection, Opus track each way, pumps, bounds,
barge-in) whose data channel speaks Live: each client message goes through `LiveDialect.incoming`
and `feed` (realtime/live_websocket.py) as a Live WebSocket frame does, and every event leaves
through `LiveDialect.outgoing`, which drops GA's bookkeeping (`session.created`,
`output_audio_buffer.*`, `response.*`...). What Live defines for WebRTC:
- the session starts when it is created: the startup config comes with the offer (no audio
  format: the track's), and `session.started` is the first event on the data channel; a
  `session.start` sent there is refused (`session_already_started`);
- reply audio is on the track, not `session.output_audio.delta` events; transcripts, delegations,
  usage and errors are on the data channel;
- the events channel is the first data channel the client opens, whatever its label;
- `session.input_audio.mute` silences the track's audio as it does appended audio.
The session is one of this server's Live sessions by its id: sidebands may attach (events,
control, and the track's audio both ways reflected as PCM16 24 kHz: live_sideband.py), it may be
forked, `POST .../hangup` ends it.

Checks run cheapest first, as for `POST /v1/realtime/calls`: body, transport and SDP text, the
Live config (coded `invalid_request_error`s naming `session.*`), then admission and the peer
connection. Without aiortc and PyAV: 501 `webrtc_unavailable`, as `POST /v1/realtime/calls`.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from session_server import strict_json
from session_server.realtime.live_dialect import LiveDialect
from session_server.realtime.live_events import LiveError
from session_server.realtime.live_fork import ForkSource, StoredSessions, seed
from session_server.realtime.live_sideband import samples_to_pcm24
from session_server.realtime.live_websocket import feed
from session_server.realtime.protocol import Action, RealtimeProtocol, SendAudio, reply_input_for
from session_server.realtime.served import served_model
from session_server.state import ServerState
from session_server.webrtc.availability import missing_modules, unavailable_response
from session_server.webrtc.config import WebRTCConfig
from session_server.webrtc.registry import CallRegistry
from session_server.webrtc.routes import CallRefused, _check_realtime_input, _initial_config, _start_call, check_sdp_text

if not missing_modules():
    from session_server.webrtc.call import INPUT_RATE, Call, new_call_id
else:  # the routes answer 501 before a call is made
    Call = object  # type: ignore[assignment,misc]

MAX_BODY_BYTES = 1024 * 1024  # the offer (64 KiB at most), instructions and startup input
# What a Live call's session asks of the core once it has started: its `session.updated` is the
# Live `session.started` (the config itself was applied before the graph opened).
_STARTED = {"type": "session.update", "session": {"type": "realtime"}}


class LiveCall(Call):  # type: ignore[misc,valid-type]
    """A WebRTC call whose data channel speaks Live (the events of live_dialect.py)."""

    events_channel = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.live_sidebands: list[Any] = []  # Live sidebands (live_sideband.py), not the GA ones of sideband.py

    def begin(self, replay: list[Any], ga_events: list[dict[str, Any]]) -> None:
        """Right after `start`, before any client message: a fork's conversation, then the start."""
        self.apply(replay)
        for event in [_STARTED, *ga_events]:
            self.apply(self.protocol.receive_text(json.dumps(event)))

    def _receive(self, message: str | bytes) -> None:
        if isinstance(message, bytes) or len(message) > self.config.max_message_bytes:
            super()._receive(message)  # refused with the GA call's coded errors, in Live's shape
            return
        translated = self.protocol.dialect.incoming(message)
        if translated.input_audio is not None:
            for sideband in self.live_sidebands:
                sideband.reflect_input(translated.input_audio)
        feed(self.protocol, translated, self.apply)

    async def receive_text(self, text: str) -> None:
        """A sideband's client event (live_sideband.py): the data channel's rules."""
        self.receive_client_message(text)

    def heard(self, samples: Any) -> Any:
        if self.live_sidebands:
            audio = samples_to_pcm24(samples, INPUT_RATE)  # the track's audio, before muting
            for sideband in self.live_sidebands:
                sideband.reflect_input_pcm24(audio)
        return np.zeros_like(samples) if self.protocol.dialect.muted else samples

    def apply(self, actions: list[Action]) -> None:
        if self.live_sidebands:  # reply audio, as the track gets it
            for action in actions:
                if isinstance(action, SendAudio):
                    audio = samples_to_pcm24(action.samples, action.sample_rate)
                    event = self.protocol.dialect.native("session.output_audio.delta")
                    event.pop("_live")
                    for sideband in self.live_sidebands:
                        sideband.reflect_output(event, audio)
        super().apply(actions)


class LiveWebRTC:
    """The Live WebRTC routes' work, set as `app.state.live_webrtc` (webrtc/__init__.py) for the
    routes of realtime/live_websocket.py, which hold the Live sessions by id (`links`)."""

    def __init__(self, state: ServerState, config: WebRTCConfig, calls: CallRegistry):
        self.state = state
        self.config = config
        self.calls = calls
        self.missing = missing_modules()

    async def create(self, request: Request, links: dict[str, Any], stored: StoredSessions | None) -> Response:
        return await self._answer(request, links, stored, None)

    async def fork(self, request: Request, source: ForkSource, links: dict[str, Any], stored: StoredSessions | None) -> Response:
        return await self._answer(request, links, stored, source)

    async def _answer(self, request: Request, links: dict[str, Any], stored: StoredSessions | None,
                      source: ForkSource | None) -> Response:
        if self.missing:
            return unavailable_response(self.missing)
        state = self.state
        try:
            _check_realtime_input(state)
            body = await _read_body(request)
            offer = _offer(body)
            call_id, session_id = new_call_id()
            protocol = RealtimeProtocol(session_id, state.settings.model_id, audio_deltas=False,
                                        reply_input=reply_input_for(state.runtime.spec.inputs), served=served_model(state),
                                        usage_totals=state.metrics.usage)
            dialect = LiveDialect(session_id, state.settings.model_id, aliases=state.settings.model_names)
            protocol.dialect = dialect  # type: ignore[assignment]
            replay = seed(protocol, source, media=True) if source is not None else []
            if stored is not None:
                stored.keep(protocol)
            try:
                if source is None:
                    if body.get("session") is None:
                        raise LiveError("missing_required_parameter", "Missing required parameter 'session'.", "session")
                    start = dialect.start_media(body["session"])
                else:
                    start = dialect.start_fork(body.get("session"), None, media=True)
            except LiveError as error:
                raise CallRefused(400, error.message, error.code, error.param) from None
            update, items = start.ga_events[0], start.ga_events[1:]
            await _initial_config(protocol, update["session"])  # the graph opens with it

            def begin(call: LiveCall) -> None:
                links[session_id] = call  # one of this server's Live sessions: sidebands, forks, hangup
                call.begin(replay, items)

            answer = await _start_call(state, self.config, self.calls, call_id, protocol, offer, call_type=LiveCall,
                                       on_closed=lambda call: links.pop(session_id, None), begin=begin)
        except CallRefused as refused:
            return refused.response()
        return JSONResponse({"session": {"id": session_id}, "transport": {"type": "webrtc", "sdp": answer}}, status_code=201)


async def _read_body(request: Request) -> dict[str, Any]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in ("application/json", ""):
        raise CallRefused(415, f"Send the Live session as application/json ({{session, transport}}); got {content_type!r}.",
                          "unsupported_content_type")
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise CallRefused(413, f"The request body is larger than {MAX_BODY_BYTES} bytes.", "request_too_large")
    try:
        body = strict_json.loads(raw) if raw else {}
    except (ValueError, RecursionError):
        raise CallRefused(400, "The request body is not valid JSON.", "invalid_json") from None
    if not isinstance(body, dict):
        raise CallRefused(400, "The request body must be a JSON object.", "invalid_type")
    unknown = sorted(set(body) - {"session", "transport"})
    if unknown:
        raise CallRefused(400, f"Unknown parameter {unknown[0]!r}.", "unknown_parameter", unknown[0])
    return body


def _offer(body: dict[str, Any]) -> str:
    transport = body.get("transport")
    if not isinstance(transport, dict):
        raise CallRefused(400, "Missing required parameter 'transport' ({type: \"webrtc\", sdp}).",
                          "missing_required_parameter", "transport")
    unknown = sorted(set(transport) - {"type", "sdp"})
    if unknown:
        raise CallRefused(400, f"Unknown parameter 'transport.{unknown[0]}'.", "unknown_parameter", f"transport.{unknown[0]}")
    if transport.get("type") != "webrtc":
        raise CallRefused(400, "`transport.type` is `webrtc` (Live over WebSocket is `GET /v1/live/sessions`; SIP is not "
                          "served).", "invalid_value", "transport.type")
    check_sdp_text(transport.get("sdp"), "transport.sdp")
    return transport["sdp"]
