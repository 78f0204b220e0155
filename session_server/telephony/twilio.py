"""`/v1/telephony/twilio`: a carrier media stream (Twilio Media Streams' JSON protocol) as a call.

A Twilio `<Connect><Stream url="wss://HOST/v1/telephony/twilio">` opens this WebSocket and
speaks its JSON messages (https://www.twilio.com/docs/voice/media-streams/websocket-messages):

    in:  connected  (optional greeting)
         start      {start: {streamSid, callSid, mediaFormat, customParameters}}: the call begins
         media      {media: {payload: base64 8 kHz mu-law}}: the caller's audio
         mark       {mark: {name}}: the carrier played up to a mark we sent
         dtmf       {dtmf: {digit}}: a keypad press
         stop       the call ended: the session ends, its slot is free
    out: media      {streamSid, media: {payload}}: reply audio, one 20 ms frame (160 bytes) per 20 ms
         mark       {streamSid, mark: {name: RESPONSE_ID}}: after each reply's last frame
         clear      {streamSid}: barge-in, drop what the carrier buffered of the reply

Each stream is one realtime session on the protocol core (phone_call.py), its session settings
the profile's `sip.accept` with the `start` message's `customParameters` `instructions` and
`voice` on top; its call id is `twilio_` + the carrier's callSid (or a fresh id), under which
`GET /v1/realtime?call_id=` attaches a sideband that gets the session's events (DTMF as
`input_audio_buffer.dtmf_event_received`) and may send client events.

Bad input never ends the server or another call: a message that is not JSON, an unknown
`event`, media before `start`, bad base64, a wrong media format... gets one
`{"event": "error", "error": {type, code, message, param}}` message (the realtime protocol's
error shape; Twilio ignores messages it does not know) and the stream goes on, except where
the stream cannot (an unsupported media format, a refused session config, no free session
slot): then the error, and the socket is closed (1008, or 1013 when full).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import re
import secrets
from typing import Any

import numpy as np
from starlette.websockets import WebSocket

from graph.errors import SessionRejected
from session_server.realtime.audio_formats import PCMU, ULAW_DECODE, g711
from session_server.realtime.events import RealtimeError
from session_server.realtime.protocol import RealtimeProtocol
from session_server.state import ServerState
from session_server.telephony.config import TelephonyConfig
from session_server.telephony.phone_audio import PHONE_RATE
from session_server.telephony.phone_call import DTMF_KEYS, PhoneCall
from session_server.telephony.phone_session import phone_audio, phone_protocol, start_call
from session_server.telephony.registry import PhoneCalls

log = logging.getLogger("session_server.telephony")

PATH = "/v1/telephony/twilio"
# One message: Twilio sends 20 ms (160 bytes, 216 base64 characters) per media message.
MAX_MESSAGE_CHARS = 64 * 1024
MEDIA_ENCODING = "audio/x-mulaw"
CLOSE_POLICY, CLOSE_TRY_AGAIN = 1008, 1013
_CALL_SID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class StreamError(Exception):
    """A message the stream refuses: `code` for clients to branch on; `fatal` ends the stream."""

    def __init__(self, code: str, message: str, param: str | None = None, fatal: bool = False, close_code: int = CLOSE_POLICY):
        super().__init__(message)
        self.code, self.message, self.param, self.fatal, self.close_code = code, message, param, fatal, close_code


class TwilioWire:
    """The outbound half of the stream: frames, marks and clears as Twilio's JSON messages."""

    def __init__(self, websocket: WebSocket, stream_sid: str):
        self.websocket = websocket
        self.stream_sid = stream_sid
        self.outbox: asyncio.Queue[str | None] = asyncio.Queue()

    def _queue(self, message: dict[str, Any]) -> None:
        self.outbox.put_nowait(json.dumps({"streamSid": self.stream_sid, **message}, separators=(",", ":")))

    def send_audio(self, samples: np.ndarray) -> None:
        self._queue({"event": "media", "media": {"payload": base64.b64encode(g711(samples, PCMU)).decode("ascii")}})

    def send_silence(self) -> None:
        pass  # the carrier fills gaps itself; a stream sends only reply audio

    def send_mark(self, name: str) -> None:
        self._queue({"event": "mark", "mark": {"name": name}})

    def clear(self) -> None:
        # What is still queued here is dropped too: the carrier would play it after the clear.
        while not self.outbox.empty():
            self.outbox.get_nowait()
        self._queue({"event": "clear"})

    async def hang_up(self, reason: str) -> None:
        self.outbox.put_nowait(None)  # the writer sends what is queued, then stops

    async def write(self) -> None:
        while (text := await self.outbox.get()) is not None:
            await self.websocket.send_text(text)


async def serve_twilio(websocket: WebSocket, state: ServerState, calls: PhoneCalls) -> None:
    await websocket.accept()
    stream = _Stream(websocket, state, calls)
    try:
        await stream.run()
    finally:
        await stream.end()


class _Stream:
    def __init__(self, websocket: WebSocket, state: ServerState, calls: PhoneCalls):
        self.websocket = websocket
        self.state = state
        self.calls = calls
        self.call: PhoneCall | None = None
        self.wire: TwilioWire | None = None
        self.writer: asyncio.Task[None] | None = None
        self.stream_sid: str | None = None
        self.end_reason = "client_closed"  # `stop`: "stream_stopped"
        self.disconnected = False
        self.close_code = 1000

    async def run(self) -> None:
        ended: asyncio.Task[Any] | None = None  # the call's end, watched once it has started
        try:
            while True:
                if self.call is None:
                    message = await self.websocket.receive()
                else:
                    if ended is None:
                        ended = asyncio.create_task(self.call.closed.wait())
                    receiving = asyncio.ensure_future(self.websocket.receive())
                    await asyncio.wait([receiving, ended], return_when=asyncio.FIRST_COMPLETED)
                    if not receiving.done():
                        receiving.cancel()
                        return  # the session ended (idle, error, shutdown, operator): the stream closes
                    message = receiving.result()
                if not await self._take(message):
                    return
        finally:
            if ended is not None:
                ended.cancel()

    async def _take(self, message: dict[str, Any]) -> bool:
        """One WebSocket message; False when the stream is over."""
        if message["type"] == "websocket.disconnect":
            self.disconnected = True
            return False
        try:
            if await self.handle(message.get("text"), message.get("bytes")) == "stop":
                self.end_reason = "stream_stopped"
                return False
        except StreamError as error:
            await self.refuse(error)
            if error.fatal:
                return False
        return True

    async def handle(self, text: str | None, data: bytes | None) -> str | None:
        if text is None:
            raise StreamError("binary_frames_unsupported", "Media stream messages are JSON text.")
        if len(text) > MAX_MESSAGE_CHARS:
            raise StreamError("message_too_large", f"A message may be at most {MAX_MESSAGE_CHARS} characters; got {len(text)}.")
        try:
            message = json.loads(text)
        except (ValueError, RecursionError):
            raise StreamError("invalid_json", "The message is not valid JSON.") from None
        if not isinstance(message, dict) or not isinstance(message.get("event"), str):
            raise StreamError("invalid_message", "A message is a JSON object with an `event` string.", "event")
        event = message["event"]
        if event == "connected":
            return None
        if event == "start":
            await self.start(_object(message, "start"))
            return None
        if event not in ("media", "mark", "dtmf", "stop"):
            raise StreamError("unknown_event", f"Unknown event {event!r}; expected connected, start, media, mark, dtmf or stop.", "event")
        if self.call is None:
            if event == "stop":
                return "stop"
            raise StreamError("stream_not_started", f"`{event}` before `start`: the stream has not started.", "event")
        if event == "media":
            self.media(_object(message, "media"))
        elif event == "mark":
            name = _object(message, "mark").get("name")
            if isinstance(name, str):
                self.call.played(name)
        elif event == "dtmf":
            digit = _object(message, "dtmf").get("digit")
            if not isinstance(digit, str) or digit.upper() not in DTMF_KEYS:
                raise StreamError("invalid_dtmf", f"`dtmf.digit` must be one of 0-9, *, #, A-D; got {digit!r}.", "dtmf.digit")
            self.call.dtmf(digit.upper())
        else:
            return "stop"
        return None

    def media(self, media: dict[str, Any]) -> None:
        assert self.call is not None
        track = media.get("track", "inbound")
        if track not in ("inbound", "inbound_track"):
            return  # a both-tracks stream also sends the outbound track: what we sent, not the caller
        payload = media.get("payload")
        if not isinstance(payload, str):
            raise StreamError("invalid_audio", "`media.payload` must be a base64 string.", "media.payload")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise StreamError("invalid_audio", "`media.payload` is not valid base64.", "media.payload") from None
        samples = ULAW_DECODE[np.frombuffer(data, dtype=np.uint8)].astype(np.float32) / 32768.0
        self.call.receive_audio(samples, PHONE_RATE)

    async def start(self, start: dict[str, Any]) -> None:
        if self.call is not None:
            raise StreamError("stream_already_started", "This stream has already started.", "event")
        media_format = start.get("mediaFormat") or {}
        if not isinstance(media_format, dict):
            raise StreamError("invalid_message", "`start.mediaFormat` must be an object.", "start.mediaFormat", fatal=True)
        encoding = media_format.get("encoding", MEDIA_ENCODING)
        rate = media_format.get("sampleRate", PHONE_RATE)
        channels = media_format.get("channels", 1)
        if encoding != MEDIA_ENCODING or rate != PHONE_RATE or channels != 1:
            raise StreamError("unsupported_media_format",
                              f"Only {MEDIA_ENCODING} at {PHONE_RATE} Hz mono is served; got {encoding!r} at {rate!r} Hz, {channels!r} channel(s).",
                              "start.mediaFormat", fatal=True)
        parameters = start.get("customParameters") or {}
        if not isinstance(parameters, dict):
            raise StreamError("invalid_message", "`start.customParameters` must be an object.", "start.customParameters", fatal=True)
        stream_sid = start.get("streamSid")
        self.stream_sid = stream_sid if isinstance(stream_sid, str) else None
        call_sid = start.get("callSid")
        token = secrets.token_hex(12)
        call_id = f"twilio_{call_sid}" if isinstance(call_sid, str) and _CALL_SID.match(call_sid) and not self.calls.get(f"twilio_{call_sid}") else f"twilio_{token}"
        protocol = await self.session_protocol(f"sess_{token}", parameters)
        config = TelephonyConfig.from_profile(self.state.settings.profile)
        wire = TwilioWire(self.websocket, self.stream_sid or "")
        try:
            call = await start_call(self.state, self.calls, call_id, protocol, wire, "twilio", config.media_timeout_s)
        except SessionRejected as rejected:
            raise StreamError(rejected.code, rejected.message, fatal=True,
                              close_code=CLOSE_TRY_AGAIN if rejected.code in ("session_limit_reached", "server_shutting_down") else CLOSE_POLICY) from None
        self.wire = wire
        self.writer = asyncio.create_task(wire.write(), name=f"{call_id}:writer")
        self.call = call
        log.info("twilio stream %s: call %s, session %s", self.stream_sid, call_id, protocol.session_id)

    async def session_protocol(self, session_id: str, parameters: dict[str, Any]) -> RealtimeProtocol:
        patch: dict[str, Any] = {}
        for key in ("instructions", "voice"):
            value = parameters.get(key)
            if value is not None and not isinstance(value, str):
                raise StreamError("invalid_type", f"`customParameters.{key}` must be a string.", f"start.customParameters.{key}", fatal=True)
        if isinstance(parameters.get("instructions"), str):
            patch["instructions"] = parameters["instructions"]
        if isinstance(parameters.get("voice"), str):
            patch["audio"] = {"output": {"voice": parameters["voice"]}}
        accept = TelephonyConfig.from_profile(self.state.settings.profile).accept
        try:
            return await phone_protocol(self.state, session_id, phone_audio(PCMU), accept, patch)
        except RealtimeError as error:
            raise StreamError(error.code, error.message, error.param, fatal=True) from None

    async def refuse(self, error: StreamError) -> None:
        log.info("twilio stream %s: refused %s: %s", self.stream_sid, error.code, error.message)
        body = {"event": "error", "error": {"type": "invalid_request_error", "code": error.code, "message": error.message, "param": error.param}}
        if self.stream_sid:
            body["streamSid"] = self.stream_sid
        text = json.dumps(body, separators=(",", ":"))
        if self.wire is not None:
            self.wire.outbox.put_nowait(text)  # in order with the stream's own messages
        else:
            with contextlib.suppress(Exception):
                await self.websocket.send_text(text)
        if error.fatal:
            self.close_code = error.close_code

    async def end(self) -> None:
        """The stream is over (stop, disconnect, session ended, refusal): free everything."""
        if self.call is not None:
            await self.call.close(self.end_reason)
        if self.writer is not None:
            with contextlib.suppress(BaseException):
                async with asyncio.timeout(2.0):
                    await self.writer
            self.writer.cancel()
        if not self.disconnected:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await self.websocket.close(self.close_code)


def _object(message: dict[str, Any], key: str) -> dict[str, Any]:
    value = message.get(key)
    if not isinstance(value, dict):
        raise StreamError("invalid_message", f"`{key}` must be an object.", key)
    return value
