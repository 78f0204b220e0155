"""Time to first audio, measured the same on every link: from the end of the user's turn to a
reply's first audio leaving the server.

A link shows it every server event (`observe`: the turn ends at `speech_stopped` or `committed`,
and the reply's wait begins at `response.created`; a reply created with no turn before it waits
from then) and says when a reply's first audio left (`left`): the WebSocket at its first
`response.output_audio.delta`, a call when its first frame leaves on the wire. The wait goes to
`metrics.first_audio(transport, seconds)` (session_server/metrics.py).
"""

from __future__ import annotations

import time
from typing import Any

# Replies whose first audio is awaited at once; an older one (a reply with no audio) is forgotten.
MAX_AWAITED = 64


class FirstAudio:
    def __init__(self, metrics: Any = None):
        self.metrics = metrics  # anything with `first_audio(transport, seconds)`, or None
        self._turn_ended_at: float | None = None
        self._awaiting: dict[str, float] = {}  # response id -> when its wait for first audio began

    def observe(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind in ("input_audio_buffer.speech_stopped", "input_audio_buffer.committed") and self._turn_ended_at is None:
            self._turn_ended_at = time.monotonic()
        elif kind == "response.created":
            started = self._turn_ended_at if self._turn_ended_at is not None else time.monotonic()
            self._awaiting[event["response"]["id"]] = started
            self._turn_ended_at = None
            if len(self._awaiting) > MAX_AWAITED:
                del self._awaiting[next(iter(self._awaiting))]

    def left(self, response_id: str, transport: str) -> None:
        """Audio of `response_id` left: the first time, its wait is recorded under `transport`."""
        started = self._awaiting.pop(response_id, None)
        if started is not None and self.metrics is not None:
            self.metrics.first_audio(transport, time.monotonic() - started)
