"""Uploaded-voice lookups made off the event loop, ahead of the client event that needs them.

A voice name that is neither a built-in speaker nor one of the profile's aliases may name an
uploaded voice, and finding out reads the voice registry: a directory listing behind a lock that
uploads hold while they write, or a request to a shared store. That must not stall the event
loop every session shares. So a transport, before it hands the protocol a client event, asks
which names the event will look up (`RealtimeProtocol.voices_to_look_up`), runs those lookups in
a worker thread (`VoiceLookups.resolve`), and the config code then finds each answer here, once
(`VoiceLookups.speaker`, the session's `ServedModel.uploaded_speaker`). A name that was not
looked up ahead is looked up in place, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from session_server.realtime.events import RealtimeError


class LooksUpVoices(Protocol):
    """What `look_up_voices` needs of the protocol core (`RealtimeProtocol`): this module is
    below the core (the core keeps a `VoiceLookups`), so it names the two methods, not the class."""

    def voices_to_look_up(self, event: str | dict[str, Any]) -> list[str]: ...

    def look_up_voice(self, name: str) -> None: ...


class VoiceLookups:
    """One session's lookups of uploaded voices: answers made ahead, each used once."""

    def __init__(self, lookup: Callable[[str], str | None]):
        self._lookup = lookup  # name -> built-in speaker, None when not uploaded; raises RealtimeError
        self._answers: dict[str, str | RealtimeError | None] = {}

    def resolve(self, name: str) -> None:
        """Look `name` up now and keep the answer for the event that needs it. Blocking: run it
        in a worker thread."""
        try:
            answer: str | RealtimeError | None = self._lookup(name)
        except RealtimeError as error:
            answer = error
        self._answers[name] = answer

    def speaker(self, name: str) -> str | None:
        """The answer `resolve` kept for `name` (taken: the next event looks up again), else a
        lookup in place."""
        if name not in self._answers:
            return self._lookup(name)
        answer = self._answers.pop(name)
        if isinstance(answer, RealtimeError):
            raise answer
        return answer


def voice_names(event: Any) -> list[str]:
    """The voice names a client event (parsed JSON) asks for: `session.update`'s
    `session.audio.output.voice` (GA) or `session.voice` (beta), `response.create`'s
    `response.audio.output.voice` or `response.voice`. A voice is a name or `{"id": name}`."""
    if not isinstance(event, dict):
        return []
    kind = event.get("type")
    params = event.get("session") if kind == "session.update" else event.get("response") if kind == "response.create" else None
    if not isinstance(params, dict):
        return []
    output = (params.get("audio") or {}).get("output") if isinstance(params.get("audio"), dict) else None
    candidates = [output.get("voice") if isinstance(output, dict) else None, params.get("voice")]
    names = []
    for voice in candidates:
        if isinstance(voice, dict):
            voice = voice.get("id")
        if isinstance(voice, str) and voice and voice not in names:
            names.append(voice)
    return names


async def look_up_voices(protocol: LooksUpVoices, event: str | dict[str, Any]) -> None:
    """The registry lookups the client event `event` needs, each in a worker thread, before the
    protocol gets the event."""
    for name in protocol.voices_to_look_up(event):
        await asyncio.to_thread(protocol.look_up_voice, name)
