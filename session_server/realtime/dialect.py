"""The OpenAI Realtime **beta** dialect: a naming layer over the GA protocol core.

The protocol core (`protocol.py`) speaks GA only. A session whose client speaks beta gets the
same events renamed and reshaped on their way out (`Dialect.outgoing`, applied by the transports
as they serialize each event), so there is one implementation of every rule.

A session speaks beta when its client connects with the `OpenAI-Beta: realtime=v1` header (the
`openai` SDK's `client.beta.realtime.connect`), offers the subprotocol `openai-beta.realtime-v1`
(browsers), or sends a first `session.update` of the beta shape (`modalities`,
`input_audio_format`, top-level `voice` / `turn_detection`..., and none of GA's `type`, `audio`,
`output_modalities`). Client events need no layer: beta field names are accepted on input in
every session (session_config.py).

What changes on the way out:
- `response.output_audio.*` -> `response.audio.*`, `response.output_audio_transcript.*` ->
  `response.audio_transcript.*`, `response.output_text.*` -> `response.text.*`;
- `conversation.item.added` -> `conversation.item.created`; `conversation.item.done` is not sent;
- item content `output_audio` -> `audio`, `output_text` -> `text`;
- the session (`session.created` / `.updated`) and the response (`response.created` / `.done`)
  in their beta shape: `modalities` (`["text", "audio"]` for audio replies), `voice`,
  `input_audio_format` / `output_audio_format` (`pcm16` = PCM16 at 24 kHz, as beta defines it;
  a 16 kHz session shows GA's format object, beta has no name for it), top-level
  `turn_detection`, `input_audio_transcription`, `temperature`, `max_response_output_tokens`.
Everything else (errors, `input_audio_buffer.*`, transcription events, `sglang.*`) is the same.
A transcription session keeps GA's session shape (beta had a separate transcription endpoint).

A third dialect, `sglang-omni-v0`, is what the compatibility preset of that name (compat.py) gives
a client that does not say which dialect it speaks: beta from `session.created` on, and a spoken
reply's message carries a `text` part (its transcript) next to its `audio` part, as sglang-omni
v0.1.1 sent it. Such a session switches to GA when its first `session.update` has GA's shape (any
of `type`, `audio`, `output_modalities`); any other first update keeps it.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from session_server.realtime.events import SessionParam

GA = "ga"
BETA = "beta"
SGLANG_OMNI_V0 = "sglang-omni-v0"  # beta, as sglang-omni v0.1.1 spoke it (compat.py)
BETA_HEADER = ("openai-beta", "realtime=v1")
BETA_SUBPROTOCOL = "openai-beta.realtime-v1"

_RENAMED = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
}
_NOT_IN_BETA = frozenset({"conversation.item.done"})
_CONTENT_TYPES = {"output_audio": "audio", "output_text": "text"}
_BETA_FORMATS = {("audio/pcm", 24000): "pcm16", ("audio/pcmu", None): "g711_ulaw", ("audio/pcma", None): "g711_alaw"}
_BETA_ONLY = ("modalities", "input_audio_format", "output_audio_format", "voice", "turn_detection",
              "input_audio_transcription", "max_response_output_tokens", "temperature")
_GA_ONLY = ("type", "audio", "output_modalities")
DEFAULT_TEMPERATURE = 0.8  # what beta sessions show when the client set none


def beta_requested(headers: list[tuple[bytes, bytes]], subprotocols: list[str]) -> bool:
    """Whether the WebSocket handshake asks for the beta dialect."""
    for name, value in headers:
        if name.lower() == BETA_HEADER[0].encode() and BETA_HEADER[1] in value.decode("latin-1").replace(" ", ""):
            return True
    return BETA_SUBPROTOCOL in subprotocols


def is_ga_shaped(session: SessionParam) -> bool:
    return any(getattr(session, name) is not UNSET for name in _GA_ONLY)


def is_beta_shaped(session: SessionParam) -> bool:
    return any(getattr(session, name) is not UNSET for name in _BETA_ONLY) and not is_ga_shaped(session)


class Dialect:
    """Which dialect a session's client speaks; decided once (handshake or first `session.update`).

    `default` is what a session speaks until then: GA, or `sglang-omni-v0` under that preset."""

    def __init__(self, default: str = GA) -> None:
        self.name = default
        self.decided = False

    def choose(self, name: str) -> None:
        self.name, self.decided = name, True

    def observe_session_update(self, session: SessionParam) -> None:
        if self.decided:
            return
        if self.name == SGLANG_OMNI_V0:
            self.choose(GA if is_ga_shaped(session) else SGLANG_OMNI_V0)
        else:
            self.choose(BETA if is_beta_shaped(session) else GA)

    def outgoing(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """The event as this session's client expects it; None: not sent in this dialect."""
        if self.name == GA:
            return event
        return to_beta(event, text_with_audio=self.name == SGLANG_OMNI_V0)


def to_beta(event: dict[str, Any], text_with_audio: bool = False) -> dict[str, Any] | None:
    """`text_with_audio`: an assistant message's `audio` part is followed by a `text` part with
    the same text (sglang-omni v0.1.1)."""
    kind = event["type"]
    if kind in _NOT_IN_BETA:
        return None
    out = dict(event)
    out["type"] = _RENAMED.get(kind, kind)
    if "session" in out and out["session"].get("object") == "realtime.session":
        out["session"] = beta_session(out["session"])
    if "response" in out:
        out["response"] = beta_response(out["response"], text_with_audio)
    if "item" in out:
        out["item"] = beta_item(out["item"], text_with_audio)
    return out


def beta_item(item: dict[str, Any], text_with_audio: bool = False) -> dict[str, Any]:
    content = item.get("content")
    if not content:
        return item
    parts = []
    for part in content:
        kind = part.get("type")
        parts.append({**part, "type": _CONTENT_TYPES.get(kind, kind)})
        if text_with_audio and kind == "output_audio":
            parts.append({"type": "text", "text": part.get("transcript") or ""})
    return {**item, "content": parts}


def beta_modalities(output_modalities: list[str]) -> list[str]:
    return ["text", "audio"] if "audio" in output_modalities else ["text"]


def beta_format(ga_format: dict[str, Any]) -> str | dict[str, Any]:
    return _BETA_FORMATS.get((ga_format["type"], ga_format.get("rate")), ga_format)


def beta_session(session: dict[str, Any]) -> dict[str, Any]:
    audio_in, audio_out = session["audio"]["input"], session["audio"]["output"]
    sglang = session.get("sglang") or {}
    return {
        "id": session["id"],
        "object": "realtime.session",
        "model": session["model"],
        "modalities": beta_modalities(session["output_modalities"]),
        "instructions": session["instructions"],
        "voice": audio_out["voice"],
        "input_audio_format": beta_format(audio_in["format"]),
        "output_audio_format": beta_format(audio_out["format"]),
        "input_audio_transcription": audio_in["transcription"],
        "input_audio_noise_reduction": audio_in["noise_reduction"],
        "turn_detection": audio_in["turn_detection"],
        "tools": session["tools"],
        "tool_choice": session["tool_choice"],
        "temperature": sglang.get("temperature", DEFAULT_TEMPERATURE),
        "max_response_output_tokens": session["max_output_tokens"],
        "speed": audio_out.get("speed", 1.0),
        "tracing": session.get("tracing"),
        "expires_at": session.get("expires_at", 0),
        "sglang": sglang,
    }


def beta_response(response: dict[str, Any], text_with_audio: bool = False) -> dict[str, Any]:
    out = {key: value for key, value in response.items() if key not in ("output_modalities", "audio")}
    out["modalities"] = beta_modalities(response["output_modalities"])
    audio_out = response["audio"]["output"]
    out["voice"] = audio_out["voice"]
    out["output_audio_format"] = beta_format(audio_out["format"])
    out["output"] = [beta_item(item, text_with_audio) for item in response["output"]]
    return out
