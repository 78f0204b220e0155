"""`sgl-omni client` / `python -m clients.python`: play a WAV into a realtime session, save the reply.

    python -m clients.python --url http://127.0.0.1:8000 --input question.wav --output reply.wav \
        [--transport websocket|webrtc] [--api-key KEY] [--instructions TEXT] [--loopback]

`--input mic` records `--mic-seconds` from the default microphone first (needs the optional
`sounddevice` package). The audio (any rate, mixed to mono) is streamed in real time, followed by silence so that the
server's VAD ends the turn. Events are printed as they arrive (with seconds since the start;
audio deltas are summarised), then the time to first audio: from the server's
`input_audio_buffer.speech_stopped` to the first reply audio received (WebSocket: the first
`response.output_audio.delta`; WebRTC: the first audible frame on the server's track). The
reply audio is written to `--output` (24 kHz PCM16 WAV). Exit status 0 when a reply came (`completed`, or `incomplete` at the token limit).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import soxr

from clients.python.audio import TRACK_RATE, MicrophoneUnavailable, read_wav, record_microphone, write_wav

OUTPUT_RATE = 24000


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sgl-omni client", description="Play a WAV file into a realtime session and save the spoken reply.")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    parser.add_argument("--input", required=True, help="WAV (or any soundfile format) to speak into the session, or `mic`")
    parser.add_argument("--mic-seconds", type=float, default=5.0, help="with --input mic: seconds to record before sending")
    parser.add_argument("--output", default="reply.wav", help="where to write the reply audio (24 kHz WAV)")
    parser.add_argument("--transport", choices=["websocket", "webrtc"], default="websocket")
    parser.add_argument("--api-key", default=os.environ.get("SGL_OMNI_API_KEY"), help="Bearer key (env SGL_OMNI_API_KEY)")
    parser.add_argument("--model", help="model id to ask for (default: whatever the server serves)")
    parser.add_argument("--instructions", help="session instructions")
    parser.add_argument("--tail-silence", type=float, default=1.5, help="seconds of silence after the file (lets VAD end the turn)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the reply")
    parser.add_argument("--loopback", action="store_true", help="WebRTC: offer only a 127.0.0.1 candidate (server on this machine)")
    parser.add_argument("--quiet", action="store_true", help="print only the summary")
    return parser.parse_args(argv)


class Printer:
    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.started = time.monotonic()

    def event(self, at: float, event: dict[str, Any]) -> None:
        if self.quiet or event["type"].endswith(("output_audio.delta", "transcript.delta", "text.delta")):
            return
        detail = ""
        if event["type"] == "error":
            detail = f"{event['error'].get('code')}: {event['error'].get('message')}"
        elif event["type"] == "response.done":
            detail = event["response"]["status"]
        elif "transcript" in event:
            detail = repr(event["transcript"])
        print(f"{at - self.started:8.3f}s  {event['type']} {detail}".rstrip(), flush=True)

    def line(self, text: str) -> None:
        print(text, flush=True)


async def run(args: argparse.Namespace) -> int:
    if args.input == "mic":
        try:
            samples = record_microphone(args.mic_seconds, OUTPUT_RATE)
        except MicrophoneUnavailable as exc:
            print(f"sgl-omni client: {exc}", file=sys.stderr)
            return 2
    else:
        samples = read_wav(args.input, OUTPUT_RATE)
    speech = np.concatenate([samples, np.zeros(int(args.tail_silence * OUTPUT_RATE), np.float32)])
    session = {"instructions": args.instructions} if args.instructions else {}
    printer = Printer(args.quiet)
    if args.transport == "websocket":
        status, reply, first_audio_s = await _over_websocket(args, speech, session, printer)
    else:
        status, reply, first_audio_s = await _over_webrtc(args, speech, session, printer)
    write_wav(args.output, reply, OUTPUT_RATE)
    printer.line(f"reply: {status}, {len(reply) / OUTPUT_RATE:.2f} s of audio -> {args.output}")
    printer.line("time to first audio: " + (f"{first_audio_s * 1000:.0f} ms" if first_audio_s is not None else "n/a"))
    return 0 if status in ("completed", "incomplete") else 1


async def _over_websocket(args, speech: np.ndarray, session: dict, printer: Printer):
    from clients.python.websocket import WebSocketSession

    async with WebSocketSession.connect(args.url, args.api_key, args.model) as call:
        if session:
            await call.send({"type": "session.update", "session": session})
        streaming = asyncio.create_task(call.stream_audio(speech))
        done: dict[str, Any] | None = None
        try:
            async with asyncio.timeout(args.timeout):
                while done is None:
                    event = await call.next_event()
                    printer.event(*call.log[-1])
                    if event["type"] == "response.done":
                        done = event
                    elif event["type"] == "session.closed":
                        break
        finally:
            streaming.cancel()
        stopped = next((t for t, e in call.log if e["type"] == "input_audio_buffer.speech_stopped"), None)
        first = next((t for t, _, _ in call.audio if stopped is not None and t >= stopped), None)
        response_id = done["response"]["id"] if done else None
        status = done["response"]["status"] if done else "no reply"
        return status, call.reply_audio(response_id), (first - stopped) if first is not None and stopped is not None else None


async def _over_webrtc(args, speech: np.ndarray, session: dict, printer: Printer):
    from clients.python.webrtc import WebRTCSession

    async with WebRTCSession.connect(args.url, args.api_key, session or None, loopback=args.loopback, model=args.model) as call:
        call.microphone.play(speech, OUTPUT_RATE)
        done: dict[str, Any] | None = None
        async with asyncio.timeout(args.timeout):
            while True:
                # After response.done the reply may still be playing: wait for the track to stop.
                playing = done is not None and call.event_time("output_audio_buffer.started") is not None
                try:
                    event = await call.next_event(timeout=args.timeout if done is None or playing else 1.0)
                except TimeoutError:
                    break  # a reply without audio
                printer.event(*call.log[-1])
                if event["type"] == "response.done":
                    done = event
                    if event["response"]["status"] in ("cancelled", "failed"):
                        break
                if event["type"] in ("output_audio_buffer.stopped", "output_audio_buffer.cleared") and done is not None:
                    break
                if event["type"] == "session.closed":
                    break
        await asyncio.sleep(0.3)  # the last frames are still in the receiver's jitter buffer
        stopped = call.event_time("input_audio_buffer.speech_stopped")
        started = call.event_time("output_audio_buffer.started", after=stopped or 0.0)
        first = call.first_sound_after(stopped) if stopped is not None else None
        audio = call.received_audio(started - 0.1, float("inf")) if started is not None else np.zeros(0, np.float32)
        reply = soxr.resample(_trim_silence(audio), TRACK_RATE, OUTPUT_RATE).astype(np.float32) if audio.size else audio
        status = done["response"]["status"] if done else "no reply"
        if started is not None and stopped is not None:
            printer.line(f"output_audio_buffer.started: {(started - stopped) * 1000:.0f} ms after speech_stopped (server side)")
        return status, reply, (first - stopped) if first is not None and stopped is not None else None


def _trim_silence(samples: np.ndarray, threshold: float = 1e-3) -> np.ndarray:
    loud = np.flatnonzero(np.abs(samples) > threshold)
    return samples[loud[0] : loud[-1] + 1] if loud.size else samples[:0]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(run(args))
    except Exception as exc:  # noqa: BLE001 - a refused or unreachable server is one line, not a traceback
        reason = refusal_reason(exc, args.url)
        if reason is None:
            raise
        print(f"sgl-omni client: {reason}", file=sys.stderr)
        return 1


def refusal_reason(exc: BaseException, url: str) -> str | None:
    """One line for a server that refused the session or could not be reached (None: a bug, re-raised)."""
    import socket

    import httpx
    import websockets

    from clients.python.webrtc import CallFailed

    if isinstance(exc, websockets.exceptions.InvalidStatus):
        return f"the server refused the session ({exc.response.status_code}): {_error_message(exc.response.body)}"
    if isinstance(exc, CallFailed):
        return f"the server refused the call ({exc.status}): {_error_message(exc.body)}"
    if isinstance(exc, (ConnectionError, socket.gaierror, httpx.TransportError, websockets.exceptions.InvalidHandshake)):
        return f"cannot reach the server at {url} ({exc or type(exc).__name__}): is it running (`make serve`)?"
    return None


def _error_message(body: Any) -> str:
    """The `error.message` of an OpenAI-shaped error body (bytes, text or parsed), else the body as text."""
    import json

    if isinstance(body, (bytes, bytearray, str)):
        text = body if isinstance(body, str) else bytes(body).decode(errors="replace")
        try:
            body = json.loads(text)
        except ValueError:
            return text.strip() or "(no body)"
    if isinstance(body, dict) and isinstance(body.get("error"), dict) and body["error"].get("message"):
        error = body["error"]
        return f"{error['message']}" + (f" [{error['code']}]" if error.get("code") else "")
    return str(body)


if __name__ == "__main__":
    sys.exit(main())
