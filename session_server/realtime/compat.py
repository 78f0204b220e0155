"""Compatibility presets: what a WebSocket client that does not say which dialect it speaks gets.

An operator chooses one for the whole server (`sgl-omni serve --realtime-compat NAME`, or the
profile's `realtime.compat: NAME`); without one (the default) such a client gets OpenAI Realtime
GA and its defaults. WebRTC calls are GA whatever the preset.

`sglang-omni-v0`: what sglang-omni v0.1.1's `/v1/realtime` gave, for clients written against it
(their e2e tests `tests/test_model/test_qwen3_omni_realtime*.py` connect without a header and
may never send `session.update`):
- the beta dialect's names and shapes from `session.created` on, and a `text` part next to the
  `audio` part of a spoken reply's message (dialect.py, `SGLANG_OMNI_V0`);
- text replies (`modalities: ["text"]`, their thinker-only server's default) until the client
  asks for audio;
- user transcripts on (`input_audio_transcription` {model: null}): every committed user audio
  turn gets `conversation.item.input_audio_transcription.*`, all of it after that turn's
  `response.done` (protocol.py holds it while the reply is open: their server transcribed in a
  second pass after the reply, and their clients wait for it in that order);
- turns queued, never cancelled by barge-in (`turn_detection.interrupt_response: false`): their
  server answered every server VAD turn in order, so an utterance with a pause in it (their
  `query_to_draw.wav` fixture has ~1 s mid-sentence: two turns here) gets two complete replies,
  the second waiting for the first (protocol.py's queue of replies), where barge-in would cancel
  the first with `turn_detected`.
A client that marks itself GA (a first `session.update` with `type`, `audio` or
`output_modalities`) gets GA's names from then on, and the beta header or subprotocol chooses plain
beta, as without a preset; the preset's defaults stay until such a client changes them. Input
audio is not bent: `pcm16` is PCM16 at 24 kHz, as beta defines it (their tests stream 16 kHz under
it, which this server hears 1.5x fast; server VAD still finds the turn).
"""

from __future__ import annotations

from dataclasses import replace

from session_server.realtime.dialect import GA, SGLANG_OMNI_V0
from session_server.realtime.session_config import SessionConfig, Transcription, TurnDetection

PRESETS = (SGLANG_OMNI_V0,)


def initial_config(preset: str | None, config: SessionConfig) -> SessionConfig:
    """A new session's config under `preset` (None: the GA defaults, unchanged)."""
    if preset == SGLANG_OMNI_V0:
        return replace(config, output_modalities=("text",), transcription=Transcription(),
                       turn_detection=TurnDetection(interrupt_response=False))
    return config


def default_dialect(preset: str | None) -> str:
    """The dialect a session speaks until its client says which it speaks."""
    return SGLANG_OMNI_V0 if preset == SGLANG_OMNI_V0 else GA
