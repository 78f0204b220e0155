"""An optional record of what a runtime's compute ran, for finding where a slow turn's time went.

With `compute: {unit_trace: DIR}` in the profile, every runtime (each engine process) records
each unit of compute it ran (a call or a batch: when, how long, its CPU time, the batcher's name
or the call's function, and for each item the phase of the reply it served), and for each turn
the moment its `speech_stopped` and its first audio left the graph, each rebuild of a session's
context after a truncation (`rebuilds`), and when each node took each message of a session that
is not streamed data (`hops`: the turn's way from the dialog through preprocessing, encoders and
thinker to the talker; audio chunks, hidden chunks, codec frames, text deltas and reply audio are
left out). At stop it writes them to `DIR/units-<pid>.json`;
`python -m benchmarks.unit_trace DIR` reads them.

Phases (`PlaybackClock.phase`, graph/session.py): `first` (a reply asked for, no audio yet: the
first-audio path), `playing` (its audio has started), `unasked` (no reply asked for: an
utterance prefilled in its pause), `other` (work outside the reply side: VAD, preprocessing,
encoders).

Off by default; on, it costs a list append per unit and a context lookup per submitted item.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class UnitTrace:
    def __init__(self, directory: str):
        self.path = Path(directory) / f"units-{os.getpid()}.json"
        # (started, ended, cpu_s, name, phases): perf_counter seconds, one phase per item
        self.units: list[tuple[float, float, float, str, list[str]]] = []
        # (at, session_id, kind): kind "speech_stopped" | "first_audio"
        self.turns: list[tuple[float, str, str]] = []
        # (at, session_id, node, message type): a node took a message (`hop`)
        self.hops: list[tuple[float, str, str, str]] = []
        # (started, ended, session_id, items dropped, tokens re-prefilled): context truncations
        self.rebuilds: list[tuple[float, float, str, int, int]] = []
        self._awaiting_audio: set[str] = set()

    def unit(self, started: float, ended: float, cpu_s: float, name: str, phases: list[str]) -> None:
        self.units.append((started, ended, cpu_s, name, phases))

    def speech_stopped(self, session_id: str) -> None:
        self.turns.append((time.perf_counter(), session_id, "speech_stopped"))
        self._awaiting_audio.add(session_id)

    def rebuild(self, session_id: str, started: float, ended: float, dropped: int, tokens: int) -> None:
        """A truncation's rebuild of the session's context (nodes/thinker.py): its units are among
        `units` too; this says which of them were one and what they re-prefilled."""
        self.rebuilds.append((started, ended, session_id, dropped, tokens))

    def hop(self, session_id: str, node: str, message: object) -> None:
        self.hops.append((time.perf_counter(), session_id, node, type(message).__name__))

    def audio(self, session_id: str) -> None:
        """Audio left the graph: the turn's first audio, if its speech stopped and none came yet."""
        if session_id in self._awaiting_audio:
            self._awaiting_audio.discard(session_id)
            self.turns.append((time.perf_counter(), session_id, "first_audio"))

    def write(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc: dict[str, Any] = {"pid": os.getpid(), "clock": "perf_counter", "units": self.units,
                               "turns": self.turns, "hops": self.hops,
                               "rebuilds": self.rebuilds}
        self.path.write_text(json.dumps(doc))
        return self.path
