"""A server's bounds on a conversation and a reply, from the `qwen3_omni.model` resource's params.

Its own module, free of torch, so that what only reads the defaults (the bench's profile
builder) does not load the model's stack."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReplyBounds:
    """Per-server bounds on a conversation and a reply (from the resource params).

    max_seq_len: thinker context per session (tokens). A turn that does not fit fails with
        `context_exhausted`; a reply that reaches it ends with finish reason `context_exhausted`.
    max_reply_tokens: thinker tokens per reply; a reply that reaches it ends `incomplete`. The
        tiny checkpoint ends its replies on EOS after 11 tokens (random-weight presets never
        do), so the tiny profile's 16 only bounds a reply that runs on.
    max_frames_per_token / max_reply_frames: talker bounds (read by the talker node): codec
        frames per reply token once the text has ended (None: until codec EOS, as real
        checkpoints stop; the tiny profile sets 2), and per reply (`generate()`'s 4096).
    """

    max_seq_len: int = 32768
    max_reply_tokens: int = 2048
    max_frames_per_token: float | None = None
    max_reply_frames: int = 4096
