"""What a realtime session used, summed: tokens from each reply's `response.done` usage, audio
seconds in and out, turns and replies.

The protocol keeps one `SessionUsage` per session and adds to it where the numbers arise: a
reply's usage when its `response.done` is made (cancelled replies count what they produced),
input audio when it is appended (WebSocket) or decoded (WebRTC), reply audio when it is handed to
the transport. Each addition also goes to the server's `UsageTotals` (the `/metrics` counters:
session_server/metrics.py), so the counters never wait for a session to end and never go down.
The admin API (admin.py) and `session.closed` show a session's sums.

`kv_tokens` is the thinker's context as the last reply left it (that reply's input + output
tokens: the next reply's `cached_tokens` is at most this); the engines do not report the live KV
length, so an edit of the history since that reply shows at the next one.
"""

from __future__ import annotations

import msgspec

from graph.messages import Usage


class TokenCounts(msgspec.Struct, kw_only=True):
    """Tokens by kind and modality, as `response.done`'s usage reports them (cached: a part of input)."""

    input_text: int = 0
    input_audio: int = 0
    input_image: int = 0
    cached: int = 0
    output_text: int = 0
    output_audio: int = 0

    @property
    def input(self) -> int:
        return self.input_text + self.input_audio + self.input_image

    @property
    def output(self) -> int:
        return self.output_text + self.output_audio

    def add(self, usage: Usage) -> None:
        self.input_text += usage.input_text_tokens
        self.input_audio += usage.input_audio_tokens
        self.input_image += usage.input_image_tokens
        self.cached += usage.cached_tokens
        self.output_text += usage.output_text_tokens
        self.output_audio += usage.output_audio_tokens


class UsageTotals(msgspec.Struct, kw_only=True):
    """The sums of every session of one server (monotonic: the `/metrics` counters read them)."""

    tokens: TokenCounts = msgspec.field(default_factory=TokenCounts)
    audio_in_s: float = 0.0
    audio_out_s: float = 0.0


class SessionUsage(msgspec.Struct, kw_only=True):
    """One session's sums; each addition also goes to the server's `totals`, when given."""

    tokens: TokenCounts = msgspec.field(default_factory=TokenCounts)
    audio_in_s: float = 0.0
    audio_out_s: float = 0.0
    turns: int = 0  # user turns: committed utterances and user messages created
    replies: int = 0  # responses done, whatever their status
    kv_tokens: int = 0
    totals: UsageTotals | None = None

    def reply_done(self, usage: Usage) -> None:
        self.replies += 1
        self.tokens.add(usage)
        if usage.input_tokens:  # a reply that never reached the model (cancelled while queued) says nothing of the KV
            self.kv_tokens = usage.input_tokens + usage.output_tokens
        if self.totals is not None:
            self.totals.tokens.add(usage)

    def audio_in(self, seconds: float) -> None:
        self.audio_in_s += seconds
        if self.totals is not None:
            self.totals.audio_in_s += seconds

    def audio_out(self, seconds: float) -> None:
        self.audio_out_s += seconds
        if self.totals is not None:
            self.totals.audio_out_s += seconds

    def user_turn(self) -> None:
        self.turns += 1

    def record(self) -> UsageRecord:
        """As the admin API and `session.closed` show it."""
        tokens = self.tokens
        return UsageRecord(
            input_tokens=tokens.input, output_tokens=tokens.output, cached_tokens=tokens.cached,
            input_token_details=InputTokenDetails(text_tokens=tokens.input_text, audio_tokens=tokens.input_audio,
                                                  image_tokens=tokens.input_image, cached_tokens=tokens.cached),
            output_token_details=OutputTokenDetails(text_tokens=tokens.output_text, audio_tokens=tokens.output_audio),
            audio_in_seconds=round(self.audio_in_s, 3), audio_out_seconds=round(self.audio_out_s, 3),
            turns=self.turns, replies=self.replies,
        )


class InputTokenDetails(msgspec.Struct, kw_only=True):
    text_tokens: int
    audio_tokens: int
    image_tokens: int
    cached_tokens: int


class OutputTokenDetails(msgspec.Struct, kw_only=True):
    text_tokens: int
    audio_tokens: int


class UsageRecord(msgspec.Struct, kw_only=True):
    """A session's usage on the wire: token fields named as in `response.done`'s usage."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int
    input_token_details: InputTokenDetails
    output_token_details: OutputTokenDetails
    audio_in_seconds: float
    audio_out_seconds: float
    turns: int
    replies: int
