"""livekit-plugins-openai's GPTLiveModel (OpenAI's Live API) against the server's `/v1/live/sessions`.

No LiveKit room: the driver holds the model's own session, as livekit's AgentSession would
(`push_audio`, `append_commentary`), with client delegation (the Live default; the server does
not run a Responses backend). The steps: `connect` (session.start -> session.started),
`typed_turn` (commentary the model speaks), `spoken_turn`. Run by tests/live/test_live_frameworks.py
with the livekit venv: `python drive_livekit_live.py CONFIG.json`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib

from livekit import rtc
from livekit.plugins import openai
from steps import INSTRUCTIONS, RATE, TRANSCRIPT_WAIT_S, Report, ServerLog, load_config, paced_chunks, pcm


def said(log: ServerLog, mark: int, kind: str) -> str:
    return "".join(event.get("delta") or "" for event in log.since(mark, kind))


def audio_bytes(log: ServerLog, mark: int) -> int:
    return sum(len(base64.b64decode(event["delta"])) for event in log.since(mark, "session.output_audio.delta"))


async def walk(session, log: ServerLog, report: Report, config: dict) -> None:
    async with report.stepping("connect"):
        started = await log.next(0, "session.started")
        report.note(model=started["session"]["model"], served_model=started["session"].get("sglang", {}).get("served_model"),
                    delegation=started["session"].get("delegation"))

    async with report.stepping("typed_turn"):
        mark = log.mark()
        session.append_commentary("Greet the user in one short sentence.")
        done = await log.next(mark, "session.usage.updated")
        report.note(commentary_appended=bool(log.since(mark, "session.commentary.appended")),
                    said=said(log, mark, "session.output_transcript.delta"), audio_bytes=audio_bytes(log, mark),
                    usage=done["usage"])

    async with report.stepping("spoken_turn"):
        mark = log.mark()
        async for chunk in paced_chunks(pcm(config["audio"]["first"])):
            session.push_audio(rtc.AudioFrame(data=chunk, sample_rate=RATE, num_channels=1, samples_per_channel=len(chunk) // 2))
        await log.next(mark, "session.usage.updated")
        with contextlib.suppress(TimeoutError):  # transcripts may trail the reply
            async with asyncio.timeout(TRANSCRIPT_WAIT_S):
                await log.next(mark, "session.input_transcript.delta")
        report.note(heard=said(log, mark, "session.input_transcript.delta"),
                    said=said(log, mark, "session.output_transcript.delta"), audio_bytes=audio_bytes(log, mark))


async def main() -> None:
    config = load_config()
    report = Report()
    log = ServerLog()
    model = openai.realtime.GPTLiveModel(model="gpt-live-1", voice=config["voice"], delegation="client",
                                         api_key=config["api_key"], base_url=config["http_base_url"])
    session = model.session()
    handle = session._handle_event  # no public hook for the raw server events

    def record(event):
        log.add(event)
        return handle(event)

    session._handle_event = record
    session.on("error", lambda error: report.error(str(getattr(error, "error", error))))
    try:
        # What livekit's AgentSession does once it made the session: the whole configuration at once.
        await session._update_session(instructions=INSTRUCTIONS)
        await walk(session, log, report, config)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(session.aclose(), 10)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(model.aclose(), 10)
    report.end()


if __name__ == "__main__":
    asyncio.run(main())
