"""Issue 37, operators: OpenTelemetry traces of realtime turns, one trace per turn, off unless an
OTLP endpoint is configured."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from session_server import tracing
from session_server.tracing import TracingUnavailable, TurnTracing
from tests.conftest import REPO, running_server, until_true
from tests.realtime.client import API_KEY, b64, connect, utterance
from tests.realtime.fakes import realtime_profile
from tests.realtime.speech import pcm16

CHILDREN = ["turn.commit", "turn.first_token", "turn.first_audio", "turn.reply"]


def in_memory() -> tuple[TurnTracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return TurnTracing(provider.get_tracer("test"), provider), exporter


def children_of(spans, root) -> list:
    return sorted((s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id), key=lambda s: s.start_time)


async def test_a_spoken_turn_and_a_typed_one_each_make_one_trace_of_ordered_spans():
    turn_traces, exporter = in_memory()
    async with running_server(realtime_profile(reply={"words": 3, "chunk_ms": 100}), api_key=API_KEY) as srv:
        srv.state.tracing = turn_traces
        async with connect(srv) as client:
            session_id = (await client.recv())["session"]["id"]
            samples = utterance("Hello there, how are you?")
            for start in range(0, len(samples), 2400):
                await client.send({"type": "input_audio_buffer.append", "audio": b64(pcm16(samples[start:start + 2400]))})
            events = await client.until("response.done", timeout=60)
            started = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")
            stopped = next(e for e in events if e["type"] == "input_audio_buffer.speech_stopped")
            spoken = events[-1]["response"]
            await client.send({"type": "conversation.item.create",
                               "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and now"}]}})
            await client.send({"type": "response.create"})
            typed = (await client.until("response.done"))[-1]["response"]
    spans = exporter.get_finished_spans()
    roots = sorted((s for s in spans if s.name == "realtime.turn"), key=lambda s: s.start_time)
    assert len(roots) == 2
    assert roots[0].context.trace_id != roots[1].context.trace_id  # one trace per turn
    assert len(spans) == 2 + 4 + 3  # nothing but the turns' spans

    first, second = roots
    steps = children_of(spans, first)
    assert [s.name for s in steps] == CHILDREN
    assert all(s.context.trace_id == first.context.trace_id for s in steps)
    # One after another, from the end of speech to the reply's end.
    assert steps[0].start_time == first.start_time and steps[-1].end_time == first.end_time
    for before, after in zip(steps, steps[1:]):
        assert before.end_time <= after.start_time
    attributes = first.attributes
    assert attributes["session.id"] == session_id and attributes["sgl_omni.transport"] == "websocket"
    assert attributes["sgl_omni.turn"] == 1 and attributes["sgl_omni.item_id"] == stopped["item_id"]
    assert attributes["sgl_omni.input_audio_ms"] == stopped["audio_end_ms"] - started["audio_start_ms"] > 0
    assert attributes["gen_ai.response.id"] == spoken["id"] and attributes["sgl_omni.response.status"] == "completed"
    assert attributes["gen_ai.usage.input_tokens"] == spoken["usage"]["input_tokens"] > 0
    assert attributes["gen_ai.usage.output_tokens"] == spoken["usage"]["output_tokens"]
    assert attributes["sgl_omni.output_audio_tokens"] == spoken["usage"]["output_token_details"]["audio_tokens"] == 3
    assert attributes["sgl_omni.output_audio_ms"] == 300  # 3 words x 100 ms
    assert attributes["sgl_omni.cached_tokens"] == 0

    # A typed turn has no end of speech: it starts with its reply; its cache holds the first turn.
    steps = children_of(spans, second)
    assert [s.name for s in steps] == CHILDREN[1:]
    assert second.attributes["sgl_omni.turn"] == 2 and second.attributes["gen_ai.response.id"] == typed["id"]
    assert second.attributes["sgl_omni.cached_tokens"] == typed["usage"]["input_token_details"]["cached_tokens"] > 0


async def test_a_turn_cut_off_by_the_session_end_is_ended_with_the_session():
    turn_traces, exporter = in_memory()
    async with running_server(realtime_profile(reply={"words": 50, "delay_s": 0.05}), api_key=API_KEY) as srv:
        srv.state.tracing = turn_traces
        async with connect(srv) as client:
            await client.recv()
            await client.send({"type": "conversation.item.create",
                               "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "talk"}]}})
            await client.send({"type": "response.create"})
            await client.until("response.output_audio_transcript.delta")
            await client.send({"type": "session.close"})
            await client.until("session.closed")
    (root,) = [s for s in exporter.get_finished_spans() if s.name == "realtime.turn"]
    assert root.attributes["sgl_omni.response.status"] == "cancelled"  # session.close cancels the reply


def test_without_an_endpoint_tracing_is_off_and_the_sdk_is_never_imported():
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = ("import sys; from session_server import app, cli, tracing; "
            "assert tracing.from_settings(None) is None; "
            "assert not [m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))]")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, check=True)


def test_an_endpoint_without_the_sdk_installed_is_refused_with_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)  # as if absent
    with pytest.raises(TracingUnavailable, match=r"sgl-omni-server\[otel\]"):
        tracing.from_settings("http://127.0.0.1:4318")


def test_spans_reach_the_otlp_endpoint_named_by_the_flag(monkeypatch):
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(name, raising=False)
    received: list[tuple[str, bytes]] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the handler's protocol
            received.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    try:
        turn_traces = tracing.from_settings(f"http://127.0.0.1:{collector.server_port}")
        assert turn_traces is not None
        trace = turn_traces.session("sess_1", "websocket")
        trace.observe({"type": "response.created", "response": {"id": "resp_1", "output_modalities": ["text"]}})
        trace.observe({"type": "response.done", "response": {"id": "resp_1", "status": "completed", "usage": None}})
        turn_traces.shutdown()  # flushes the batch
    finally:
        collector.shutdown()
        collector.server_close()
    assert [path for path, _ in received] == ["/v1/traces"]
    request = ExportTraceServiceRequest.FromString(received[0][1])
    names = [span.name for resource in request.resource_spans for scope in resource.scope_spans for span in scope.spans]
    assert sorted(names) == ["realtime.turn", "turn.first_token"]
    service = {a.key: a.value.string_value for a in request.resource_spans[0].resource.attributes}["service.name"]
    assert service == "sgl-omni"


async def test_a_webrtc_turn_ends_its_first_audio_span_when_its_audio_reaches_the_track():
    from clients.python.webrtc import WebRTCSession
    from tests.webrtc.helpers import webrtc_profile

    turn_traces, exporter = in_memory()
    async with running_server(webrtc_profile(reply={"words": 3, "chunk_ms": 100}), api_key=API_KEY) as srv:
        srv.state.tracing = turn_traces
        async with WebRTCSession.connect(srv.base_url, API_KEY, loopback=True) as call:
            session_id = (await call.next_event("session.created"))["session"]["id"]
            call.send({"type": "conversation.item.create",
                       "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
            call.send({"type": "response.create"})
            events = await call.events_until("response.done")
    assert events[-1]["response"]["status"] == "completed"
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name == "realtime.turn"]
    assert (root.attributes["session.id"], root.attributes["sgl_omni.transport"]) == (session_id, "webrtc")
    steps = children_of(spans, root)
    assert [s.name for s in steps] == CHILDREN[1:]
    assert steps[-1].end_time == root.end_time


async def test_a_phone_turn_ends_its_first_audio_span_when_its_audio_reaches_the_line():
    from tests.telephony.test_twilio_streams import phone_profile, started_call
    from tests.telephony.twilio_client import RATE, TwilioStream
    from tests.webrtc.helpers import utterance as spoken

    turn_traces, exporter = in_memory()
    async with running_server(phone_profile(reply={"words": 3, "chunk_ms": 100}), api_key=API_KEY) as srv:
        srv.state.tracing = turn_traces
        async with TwilioStream.connect(srv.ws_url, API_KEY) as stream:
            call = await started_call(srv, stream)
            await stream.play(spoken(rate=RATE), RATE)
            await until_true(lambda: any(s.name == "realtime.turn" for s in exporter.get_finished_spans()), timeout=40)
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name == "realtime.turn"]
    assert (root.attributes["session.id"], root.attributes["sgl_omni.transport"]) == (call.protocol.session_id, "twilio")
    assert [s.name for s in children_of(spans, root)] == CHILDREN


def test_an_unanswered_turn_ends_at_its_commit_and_an_out_of_band_reply_is_a_trace_of_its_own():
    turn_traces, exporter = in_memory()
    trace = turn_traces.session("sess_1", "websocket")
    trace.observe({"type": "input_audio_buffer.speech_started", "audio_start_ms": 100, "item_id": "item_1"})
    trace.observe({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 900, "item_id": "item_1"})
    trace.observe({"type": "input_audio_buffer.committed", "item_id": "item_1"})
    trace.observe({"type": "response.created", "response": {"id": "resp_oob", "conversation_id": None, "output_modalities": ["text"]}})
    trace.observe({"type": "response.done", "response": {"id": "resp_oob", "status": "failed", "usage": None,
                                                         "status_details": {"error": {"code": "tool_choice_unmet"}}}})
    trace.close()
    spans = exporter.get_finished_spans()
    roots = {s.attributes.get("gen_ai.response.id"): s for s in spans if s.name == "realtime.turn"}
    unanswered, oob = roots[None], roots["resp_oob"]
    assert unanswered.attributes["sgl_omni.replied"] is False and unanswered.attributes["sgl_omni.input_audio_ms"] == 800
    (commit,) = children_of(spans, unanswered)
    assert commit.name == "turn.commit" and unanswered.end_time == commit.end_time
    assert oob.status.status_code.name == "ERROR" and oob.status.description == "tool_choice_unmet"
