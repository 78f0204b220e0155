"""livekit-plugins-openai's GPTLiveModel (OpenAI's Live API) against the server's `/v1/live/sessions`.

No LiveKit room: the driver holds the model's own session, as livekit's AgentSession would
(`push_audio`, `append_commentary`), with client delegation (the Live default; the server does
not run a Responses backend). The steps: `connect` (session.start -> session.started),
`typed_turn` (commentary the model speaks), `spoken_turn`, `barge_in` (speech over a reply: a
duplex model handles it itself, livekit has no interrupt for it), `instructions_append`
(`append_instructions`), `mute` (`mute_input` / `unmute_input`), `close` (`aclose`: session.close,
then session.closed). With `"delegating": true` in its config, the one step
`delegation`: livekit's `delegation_created` answered with `append_commentary(delegation_id=...)`,
as livekit documents (a `function_tool` cannot answer a client delegation: `update_tools` refuses
tools under it). Run by tests/live/test_live_frameworks.py with the livekit venv:
`python drive_livekit_live.py CONFIG.json`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from livekit import rtc
from livekit.plugins import openai
from steps import (
    BARGE_IN_SPEEDUP,
    DELEGATE_ASK,
    INSTRUCTIONS,
    NEW_INSTRUCTIONS,
    RATE,
    Report,
    ServerLog,
    live_audio_bytes,
    live_barge_in,
    live_spoken_turn,
    load_config,
    pcm,
    speak,
    transcript,
    until,
    weather_report,
    weather_sentence,
)

OPENING = "Greet the user in one short sentence."


class Observer:
    """The session's raw events both ways (livekit's `openai_server_event_received` and
    `openai_client_event_queued`) and its own events."""

    def __init__(self, session, report: Report) -> None:
        self.server = ServerLog()
        self.sent: list[dict[str, Any]] = []  # client events but audio
        self.delegations: list[Any] = []  # GPTLiveDelegation
        self.speech_started = 0
        session.on("openai_server_event_received", self.server.add)
        session.on("openai_client_event_queued", self.on_sent)
        session.on("delegation_created", self.delegations.append)
        session.on("input_speech_started", self.on_speech_started)
        session.on("error", lambda error: report.error(str(getattr(error, "error", error))))

    def on_sent(self, event: dict[str, Any]) -> None:
        if event.get("type") != "session.input_audio.append":
            self.sent.append(event)

    def on_speech_started(self, _event) -> None:
        self.speech_started += 1

    def last_sent(self, kind: str) -> dict[str, Any]:
        return [event for event in self.sent if event["type"] == kind][-1]


def microphone(session) -> Any:
    """`push` for steps.speak: each chunk an rtc.AudioFrame through the session's push_audio."""
    async def push(chunk: bytes) -> None:
        session.push_audio(rtc.AudioFrame(data=chunk, sample_rate=RATE, num_channels=1, samples_per_channel=len(chunk) // 2))

    return push


async def spoken_turn(session, log: ServerLog, audio: bytes) -> dict[str, Any]:
    return await live_spoken_turn(microphone(session), log, audio)


async def acknowledged(log: ServerLog, mark: int, kind: str, sent: dict[str, Any]) -> bool:
    ack = await log.next(mark, kind)
    return ack.get("client_event_id") == sent["event_id"]


async def barge_in(session, observed: Observer, report: Report, config: dict) -> None:
    """steps.live_barge_in, and whether livekit saw the user speak (it has no interrupt for a duplex model)."""
    speech_started = observed.speech_started
    report.note(**await live_barge_in(microphone(session), observed.server, config),
                input_speech_started=observed.speech_started - speech_started)


async def walk(session, observed: Observer, report: Report, config: dict) -> None:
    log = observed.server
    async with report.stepping("connect"):
        started = await log.next(0, "session.started")
        report.note(model=started["session"]["model"], served_model=started["session"].get("sglang", {}).get("served_model"),
                    delegation=started["session"].get("delegation"))

    async with report.stepping("typed_turn"):
        mark = log.mark()
        session.append_commentary(OPENING)
        done = await log.next(mark, "session.usage.updated")
        report.note(commentary_appended=bool(log.since(mark, "session.commentary.appended")),
                    said=transcript(log, mark, "session.output_transcript.delta"), audio_bytes=live_audio_bytes(log, mark),
                    usage=done["usage"])

    async with report.stepping("spoken_turn"):
        report.note(**await spoken_turn(session, log, pcm(config["audio"]["first"])))

    async with report.stepping("barge_in"):
        await barge_in(session, observed, report, config)

    async with report.stepping("instructions_append"):
        mark = log.mark()
        session.append_instructions(NEW_INSTRUCTIONS)
        await until(lambda: any(event["type"] == "session.instructions.append" for event in observed.sent))
        sent = observed.last_sent("session.instructions.append")
        report.note(sent={"type": sent["type"], "content": sent["content"]},
                    acknowledged=await acknowledged(log, mark, "session.instructions.appended", sent),
                    next_turn=await spoken_turn(session, log, pcm(config["audio"]["second"])))

    async with report.stepping("mute"):
        mark = log.mark()
        session.mute_input()
        await until(lambda: any(event["type"] == "session.input_audio.mute" for event in observed.sent))
        muted = await acknowledged(log, mark, "session.input_audio.muted", observed.last_sent("session.input_audio.mute"))
        # Speech over a reply while muted: heard, it would cut the reply short (as in barge_in).
        reply_mark = log.mark()
        session.append_commentary(OPENING)
        await log.next(reply_mark, "session.output_audio.delta")
        await speak(microphone(session), pcm(config["audio"]["barge_in"]), BARGE_IN_SPEEDUP)
        await log.next(reply_mark, "session.usage.updated")
        report.note(muted_acknowledged=muted, reply_audio_bytes=live_audio_bytes(log, reply_mark))
        unmute_mark = log.mark()
        session.unmute_input()
        await until(lambda: any(event["type"] == "session.input_audio.unmute" for event in observed.sent))
        report.note(unmuted_acknowledged=await acknowledged(log, unmute_mark, "session.input_audio.unmuted",
                                                            observed.last_sent("session.input_audio.unmute")),
                    after_unmute=await spoken_turn(session, log, pcm(config["audio"]["first"])))

    async with report.stepping("close"):
        mark = log.mark()
        await session.aclose()
        closed = await log.next(mark, "session.closed")
        report.note(reason=closed["reason"], usage=closed.get("usage"))


async def walk_delegation(session, observed: Observer, report: Report) -> None:
    log = observed.server
    async with report.stepping("delegation"):
        session.append_commentary(DELEGATE_ASK)
        created = await log.next(0, "session.delegation.created")
        await until(lambda: bool(observed.delegations))
        delegation = observed.delegations[-1]
        mark = log.mark()
        session.append_commentary(weather_sentence(weather_report("Paris")), delegation_id=delegation.id)
        await log.next(mark, "session.commentary.appended")
        await log.next(mark, "session.usage.updated")
        sent = observed.last_sent("session.commentary.append")
        report.note(delegation=created["delegation"], framework_delegations=[d.id for d in observed.delegations],
                    sent={key: sent.get(key) for key in ("type", "delegation_id", "content")},
                    said_after_answer=transcript(log, mark, "session.output_transcript.delta"))


async def main() -> None:
    config = load_config()
    delegating = config.get("delegating", False)
    report = Report()
    model = openai.realtime.GPTLiveModel(model="gpt-live-1", voice=config["voice"], delegation="client",
                                         api_key=config["api_key"], base_url=config["http_base_url"])
    session = model.session()
    observed = Observer(session, report)
    try:
        # What livekit's AgentSession does once it made the session: the whole configuration at once.
        await session._update_session(instructions=INSTRUCTIONS)
        if delegating:
            await walk_delegation(session, observed, report)
        else:
            await walk(session, observed, report, config)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(session.aclose(), 10)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(model.aclose(), 10)
    report.end()


if __name__ == "__main__":
    asyncio.run(main())
