"""Bounds on what sessions may hold. Each says what a client sees when it is hit."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class SessionLimits:
    # Live sessions at once: a safety cap, not the capacity (that is `first_audio_goal_ms` and the
    # KV). The next one is refused with error `session_limit_reached` and closed; existing
    # sessions are unaffected. Cost past the KV: a silent session's VAD state and buffers.
    max_sessions: int = 256
    # The KV budget, per engine: `kv_tokens // max_seq_len` sessions of at most `max_seq_len`
    # thinker tokens each (every session may grow to it, so admission never leads to an
    # out-of-memory later). An engine whose KV is allocated at start (`kv_cache: preallocate`
    # on the model: the default on CUDA) holds that many rows in the thinker's and in the
    # talker's slot cache, and admits no more sessions than both hold. Past it:
    # `session_limit_reached`.
    kv_tokens: int | None = None
    max_seq_len: int | None = None
    # Admission by load (graph/load.py): a new live session is refused with
    # `session_limit_reached` when, with it speaking too, the engines' measured step times and
    # busy share say a turn's first audio would take longer than this, instead of admitting it
    # and slowing every session down. None: no such refusal (only the caps above).
    first_audio_goal_ms: float | None = None
    # Stateless speech requests in flight at once (they hold no KV across requests). Past it,
    # a speech request gets 503 with code `speech_capacity_reached`.
    max_speech_sessions: int = 32
    # Messages queued on one edge between two nodes. A full edge makes the producer wait
    # (backpressure). Cost: capacity x message size per edge per session.
    edge_capacity: int = 64
    # Messages queued for the transport. A client that stops reading fills this, then its own
    # graph stalls (never another session); the transport closes it with reason
    # `output_buffer_full` (see the transport's own send bound).
    output_capacity: int = 512
    # A session with no client input for this long is closed with reason `idle_timeout`.
    idle_timeout_s: float = 600.0
    # A session older than this is closed with reason `max_duration_reached`.
    max_session_s: float = 3600.0
    # On SIGTERM, in-flight replies get this long to finish before sessions are closed with
    # reason `server_shutdown`.
    shutdown_grace_s: float = 10.0
    # A realtime session whose socket dropped stays resumable this long (its slot and KV held on
    # its replica, its snapshot kept in the state store); a resume after it gets `session_not_found`.
    resume_ttl_s: float = 120.0
    # One text a realtime client sends the model (a message item's text, a function output,
    # `instructions`): past it the event gets `error` `text_too_long` and changes nothing. The
    # server counts UTF-8 bytes, never fewer than a byte-level BPE's tokens. Bounds one turn's prefill.
    max_text_tokens: int = 16384
    # One input image's pixels, read from its header before any decode: past it `invalid_image`.
    # Cost of a decoded image: 3-4 bytes a pixel (64 MiB at the default 4096x4096).
    max_image_pixels: int = 4096 * 4096
    # Items a realtime session's conversation keeps for the client (`conversation.item.retrieve`,
    # resume snapshots, the replay of a resumed session). Past it the oldest item leaves the
    # conversation: the client gets `conversation.item.deleted` for it, as if it had deleted it;
    # the model's context is bounded by its own truncation (`session.truncation`) and is not
    # rebuilt for it. Cost: an item's text and transcript (no audio is kept), per session.
    max_conversation_items: int = 1024
    # One HTTP request body (the server's ASGI layer; a voice upload has its own bound): past it
    # 413 `request_too_large`, before the body is read.
    max_request_bytes: int = 4 * 1024 * 1024

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SessionLimits:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown limit {unknown[0]!r} (known: {', '.join(sorted(known))})")
        limits = cls(**values)
        for f in fields(cls):
            value = getattr(limits, f.name)
            if value is not None and (not isinstance(value, (int, float)) or value <= 0):
                raise ValueError(f"{f.name} must be a positive number, got {value!r}")
        return limits

    @property
    def kv_sessions(self) -> int | None:
        """Sessions one engine's KV budget holds (None: no budget set)."""
        if self.kv_tokens and self.max_seq_len:
            return self.kv_tokens // self.max_seq_len
        return None

    @property
    def effective_max_sessions(self) -> int:
        """Sessions one engine admits: the safety cap, or its KV budget if smaller."""
        kv = self.kv_sessions
        return self.max_sessions if kv is None else max(0, min(self.max_sessions, kv))

    @property
    def first_audio_goal_s(self) -> float | None:
        return None if self.first_audio_goal_ms is None else self.first_audio_goal_ms / 1000.0
