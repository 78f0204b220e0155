"""A realtime session as data: what survives a dropped connection, and what a resume says.

Sans-I/O helpers over a `RealtimeProtocol`; `resume.py` decides when they run.

- `snapshot_of(protocol, token_sha256)`: the session's settings (`SessionConfig` less the served
  model's facts, which the serving replica fills in), what its client negotiated, and its
  conversation items. JSON-able and small: user audio is not kept.
- `restore(protocol, snapshot)`: the same session (its dialect too, when its client chose one) in
  a fresh protocol, plus the dialog `AddItem` commands that replay the conversation into a new graph session (the KV is rebuilt by prefill
  at the next turn). Each item goes to the model as text: typed text as it was, an audio item as
  its transcript (user audio is transcribed only when the session asked for transcription: an
  untranscribed user audio item stays in the conversation, but the rebuilt model history lacks
  it), function calls and outputs as they were; image parts are not replayed.

The protocol itself ends a dropped connection's replies (`RealtimeProtocol.detach`) and greets a
resumed client (`RealtimeProtocol.resumed`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from graph.messages import AddItem
from session_server.realtime.conversation import Item
from session_server.realtime.protocol import Action, RealtimeProtocol, SendToGraph, history_key
from session_server.realtime.session_config import SessionConfig
from session_server.realtime.sglang_session import Negotiation

SNAPSHOT_VERSION = 1


def snapshot_of(protocol: RealtimeProtocol, token_sha256: str) -> dict[str, Any]:
    config = dataclasses.replace(protocol.config, served=None)
    return {
        "version": SNAPSHOT_VERSION,
        "session_id": protocol.session_id,
        "token_sha256": token_sha256,
        "config": msgspec.to_builtins(config),
        "negotiation": msgspec.to_builtins(protocol.negotiation),
        "dialect": protocol.dialect.name if protocol.dialect.decided else None,
        "items": [dataclasses.asdict(item) for item in protocol.items.values()],
    }


def restore(protocol: RealtimeProtocol, snapshot: dict[str, Any]) -> list[SendToGraph]:
    """Put the snapshot's session into `protocol` (new, not yet opened); returns the commands
    that replay its conversation into the graph, in order."""
    protocol.load(msgspec.convert(snapshot["config"], SessionConfig),
                  msgspec.convert(snapshot.get("negotiation") or {}, Negotiation),
                  [Item(**fields) for fields in snapshot["items"]], snapshot.get("dialect"))
    replay = []
    for item in protocol.items.values():
        command = _replay_command(item)
        if command is not None:
            replay.append(SendToGraph(command))
    return replay


def _replay_command(item: Item) -> AddItem | None:
    key = history_key(item)  # a reply's item by its response id, as the model's history names it
    if item.type == "function_call":
        return AddItem(item_id=key, role="assistant", call={"name": item.name, "arguments": item.arguments or "{}"})
    if item.type == "function_call_output":
        return AddItem(item_id=key, role="tool", text=item.output or "")
    texts = [part.get("text") or part.get("transcript") or "" for part in item.content]
    text = "\n".join(t for t in texts if t)
    return AddItem(item_id=key, role=item.role, text=text) if text else None

