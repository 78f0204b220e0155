"""OpenTelemetry traces of realtime turns: one trace per turn, made from the server events the
protocol already emits (the transports hand each one to `SessionTrace.observe`).

Off unless configured: `sgl-omni serve --otlp-endpoint URL` or the standard
`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`. Without either nothing here
imports the SDK; with one, the SDK and the OTLP/HTTP exporter must be installed (the `otel`
extra) or the server refuses to start. Spans go out in batches (the SDK's BatchSpanProcessor)
from its own thread, never from the event loop.

A turn's trace (all children of the root, one after another):

    realtime.turn          speech stopped (or the commit, or `response.created` for a reply
                           no utterance asked for) -> `response.done`
      turn.commit          VAD end of speech -> `input_audio_buffer.committed`
      turn.first_token     `response.created` -> the reply's first text (or audio, or call):
                           preprocessing, the encoders, the thinker's prefill and its first
                           token, as ONE span: the engines do not report those stages apart
      turn.first_audio     first token -> the first audio leaving the server (WebSocket: the
                           first `response.output_audio.delta` queued for the socket; WebRTC
                           and phone calls: the first audio handed to the paced track or line,
                           which sends it in its next 20 ms frame: `audio_out`, as media audio
                           is no event)
      turn.reply           first audio (text replies: first token) -> `response.done`

Attributes on the root: `session.id`, `sgl_omni.transport`, `sgl_omni.turn` (1, 2, ... within
the session), `sgl_omni.item_id`, `sgl_omni.input_audio_ms` (the utterance as the VAD cut it),
`gen_ai.response.id`, `sgl_omni.response.status`, `gen_ai.usage.input_tokens`,
`gen_ai.usage.output_tokens`, `sgl_omni.cached_tokens`, `sgl_omni.input_audio_tokens`,
`sgl_omni.output_audio_tokens`, `sgl_omni.output_audio_ms`. A reply that fails sets the root's
status to ERROR. A committed turn that gets no reply (a transcription session) ends at its
commit, `sgl_omni.replied: false`, when the session ends.

Turns and replies are matched in order: the next `response.created` answers the oldest
committed turn not yet answered (replies start in the order their turns were committed); an
out-of-band reply (`conversation: "none"`) answers none and is a trace of its own.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("session_server.tracing")

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SERVICE_NAME = "sgl-omni"
# Committed turns waiting for their reply; past it the oldest is ended unanswered (a session
# that commits without ever asking for replies holds at most this many open traces).
MAX_PENDING_TURNS = 16

_FIRST_TOKEN_EVENTS = frozenset({
    "response.output_text.delta", "response.output_audio_transcript.delta", "response.function_call_arguments.delta",
})


class TracingUnavailable(Exception):
    """An endpoint is configured but the OpenTelemetry SDK or its OTLP exporter is not installed."""


def configured_endpoint(flag: str | None) -> str | None:
    """The endpoint traces go to: `--otlp-endpoint`, else the standard environment; None: off."""
    if flag:
        return flag
    return next((os.environ[name] for name in ENDPOINT_VARIABLES if os.environ.get(name)), None)


def from_settings(flag: str | None) -> TurnTracing | None:
    """Tracing as configured, or None (nothing imported) when no endpoint is set."""
    if configured_endpoint(flag) is None:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(
            f"an OTLP endpoint is configured but the OpenTelemetry SDK is not installed ({exc.name}): "
            "pip install 'sgl-omni-server[otel]', or unset --otlp-endpoint / OTEL_EXPORTER_OTLP_ENDPOINT"
        ) from None
    # The flag is a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is; without it the exporter reads
    # the environment itself (endpoints, headers, timeouts).
    exporter = OTLPSpanExporter(endpoint=traces_url(flag)) if flag else OTLPSpanExporter()
    provider = tracer_provider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("traces of realtime turns go to %s", traces_url(flag) if flag else configured_endpoint(None))
    return TurnTracing(provider.get_tracer("sgl_omni.realtime"), provider)


def tracer_provider() -> Any:
    """An SDK TracerProvider named after this service (OTEL_SERVICE_NAME, else `sgl-omni`)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    return TracerProvider(resource=resource)


def traces_url(base: str) -> str:
    base = base.rstrip("/")
    return base if base.endswith("/v1/traces") else base + "/v1/traces"


class TurnTracing:
    """Makes each realtime session's `SessionTrace`; `provider` (when it made one) is shut down,
    its last spans flushed, with the server."""

    def __init__(self, tracer: Any, provider: Any = None):
        self.tracer = tracer
        self.provider = provider

    def session(self, session_id: str, transport: str, usage: Any = None) -> SessionTrace:
        return SessionTrace(self.tracer, session_id, transport, usage)

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


@dataclass(eq=False)
class _Turn:
    root: Any
    number: int
    context: Any
    child: Any = None  # the one open child span
    child_name: str | None = None
    committed_ns: int | None = None
    audio_reply: bool = False
    audio_out_s: float = 0.0  # the session's audio out when the reply started
    attributes: dict[str, Any] = field(default_factory=dict)


class SessionTrace:
    """One realtime session's turns. `observe` every server event in the order it is sent;
    `close` once the session is over. Runs on the event loop; never raises into the transport."""

    def __init__(self, tracer: Any, session_id: str, transport: str, usage: Any = None):
        from opentelemetry import trace  # the API only (a dependency); the SDK came with the tracer

        self._trace = trace
        self.tracer = tracer
        self.session_id = session_id
        self.transport = transport
        self.usage = usage  # the session's SessionUsage: audio seconds sent per reply
        self._turns = 0
        self._speech_start_ms: int | None = None
        self._ending: _Turn | None = None  # speech stopped, not yet committed
        self._pending: deque[_Turn] = deque()  # committed, waiting for their reply
        self._replies: dict[str, _Turn] = {}  # response id -> its turn

    def observe(self, event: dict[str, Any]) -> None:
        try:
            self._observe(event, time.time_ns())
        except Exception:  # noqa: BLE001 - a trace is never worth a session
            log.exception("session %s: tracing failed on %s", self.session_id, event.get("type"))

    def _observe(self, event: dict[str, Any], now: int) -> None:
        kind = event["type"]
        if kind == "input_audio_buffer.speech_started":
            self._speech_start_ms = event.get("audio_start_ms")
        elif kind == "input_audio_buffer.speech_stopped":
            if self._ending is not None:  # stopped again before a commit: that one never committed
                self._end_unanswered(self._ending, now)
            self._ending = self._new_turn(now, item_id=event.get("item_id"))
            if self._speech_start_ms is not None and event.get("audio_end_ms") is not None:
                self._ending.root.set_attribute("sgl_omni.input_audio_ms", int(event["audio_end_ms"]) - int(self._speech_start_ms))
            self._open(self._ending, "turn.commit", now)
        elif kind == "input_audio_buffer.committed":
            turn, self._ending = self._ending, None
            if turn is None:  # a manual commit: the turn starts here
                turn = self._new_turn(now, item_id=event.get("item_id"))
            else:
                self._close_child(turn, now)
            turn.root.set_attribute("sgl_omni.item_id", event.get("item_id") or "")
            turn.committed_ns = now
            self._pending.append(turn)
            if len(self._pending) > MAX_PENDING_TURNS:
                self._end_unanswered(self._pending.popleft(), now)
        elif kind == "response.created":
            response = event["response"]
            out_of_band = response.get("conversation_id") is None  # answers no turn: a trace of its own
            turn = self._pending.popleft() if self._pending and not out_of_band else self._new_turn(now)
            self._replies[response["id"]] = turn
            turn.root.set_attribute("gen_ai.response.id", response["id"])
            turn.audio_reply = "audio" in (response.get("output_modalities") or ())
            turn.audio_out_s = self.usage.audio_out_s if self.usage is not None else 0.0
            self._open(turn, "turn.first_token", now)
        elif kind in _FIRST_TOKEN_EVENTS:
            turn = self._replies.get(event.get("response_id", ""))
            if turn is not None and turn.child_name == "turn.first_token":
                self._open(turn, "turn.first_audio" if turn.audio_reply else "turn.reply", now)
        elif kind == "response.output_audio.delta":
            self._first_audio(event.get("response_id", ""), now)
        elif kind == "response.done":
            response = event["response"]
            turn = self._replies.pop(response["id"], None)
            if turn is not None:
                self._finish(turn, response, now)

    def audio_out(self, response_id: str) -> None:
        """Reply audio handed to paced media (a WebRTC track, a phone line), where no event carries it."""
        try:
            self._first_audio(response_id, time.time_ns())
        except Exception:  # noqa: BLE001 - a trace is never worth a session
            log.exception("session %s: tracing failed on reply audio", self.session_id)

    def _first_audio(self, response_id: str, now: int) -> None:
        turn = self._replies.get(response_id)
        if turn is not None and turn.child_name in ("turn.first_token", "turn.first_audio"):
            if turn.child_name == "turn.first_token":  # audio before any text: no time between
                self._open(turn, "turn.first_audio", now)
            self._open(turn, "turn.reply", now)

    def close(self) -> None:
        """The session ended: end what is still open (turns that got no reply end at their commit)."""
        now = time.time_ns()
        for turn in [*([self._ending] if self._ending is not None else []), *self._pending]:
            self._end_unanswered(turn, now)
        for turn in self._replies.values():
            self._close_child(turn, now)
            turn.root.set_attribute("sgl_omni.response.status", "session_ended")
            turn.root.end(end_time=now)
        self._ending, self._pending, self._replies = None, deque(), {}

    # ------------------------------------------------------------------ spans

    def _new_turn(self, now: int, item_id: str | None = None) -> _Turn:
        self._turns += 1
        attributes: dict[str, Any] = {"session.id": self.session_id, "sgl_omni.transport": self.transport,
                                      "sgl_omni.turn": self._turns}
        if item_id:
            attributes["sgl_omni.item_id"] = item_id
        root = self.tracer.start_span("realtime.turn", context=self._trace.set_span_in_context(self._trace.INVALID_SPAN),
                                      start_time=now, attributes=attributes)
        return _Turn(root, self._turns, self._trace.set_span_in_context(root))

    def _open(self, turn: _Turn, name: str, now: int) -> None:
        """End the turn's open child, start `name` after it."""
        self._close_child(turn, now)
        turn.child = self.tracer.start_span(name, context=turn.context, start_time=now)
        turn.child_name = name

    @staticmethod
    def _close_child(turn: _Turn, now: int) -> None:
        if turn.child is not None:
            turn.child.end(end_time=now)
        turn.child, turn.child_name = None, None

    def _end_unanswered(self, turn: _Turn, now: int) -> None:
        self._close_child(turn, now)
        turn.root.set_attribute("sgl_omni.replied", False)
        turn.root.end(end_time=turn.committed_ns or now)

    def _finish(self, turn: _Turn, response: dict[str, Any], now: int) -> None:
        self._close_child(turn, now)
        root = turn.root
        status = response.get("status") or ""
        root.set_attribute("sgl_omni.replied", True)
        root.set_attribute("sgl_omni.response.status", status)
        usage = response.get("usage") or {}
        details_in = usage.get("input_token_details") or {}
        details_out = usage.get("output_token_details") or {}
        root.set_attribute("gen_ai.usage.input_tokens", int(usage.get("input_tokens") or 0))
        root.set_attribute("gen_ai.usage.output_tokens", int(usage.get("output_tokens") or 0))
        root.set_attribute("sgl_omni.cached_tokens", int(details_in.get("cached_tokens") or 0))
        root.set_attribute("sgl_omni.input_audio_tokens", int(details_in.get("audio_tokens") or 0))
        root.set_attribute("sgl_omni.output_audio_tokens", int(details_out.get("audio_tokens") or 0))
        if self.usage is not None:
            root.set_attribute("sgl_omni.output_audio_ms", round((self.usage.audio_out_s - turn.audio_out_s) * 1000))
        if status == "failed":
            from opentelemetry.trace import Status, StatusCode

            error = (response.get("status_details") or {}).get("error") or {}
            root.set_status(Status(StatusCode.ERROR, str(error.get("code") or "failed")))
        root.end(end_time=now)
