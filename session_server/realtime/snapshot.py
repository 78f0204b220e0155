"""A realtime session as data: what survives a dropped connection, and what a resume says.

Sans-I/O helpers over a `RealtimeProtocol`; `resume.py` decides when they run.

- `snapshot_of(protocol, token_sha256)`: the session's settings (`SessionConfig` less the served
  model's facts, which the serving replica fills in), what its client negotiated, and its
  conversation items. JSON-able and small: user audio is not kept.
- `restore(protocol, snapshot)`: the same session in a fresh protocol, plus the dialog `add_item`
  commands that replay the conversation into a new graph session (the KV is rebuilt by prefill
  at the next turn). Each item goes to the model as text: typed text as it was, an audio item as
  its transcript (user audio is transcribed only when the session asked for transcription: an
  untranscribed user audio item stays in the conversation, but the rebuilt model history lacks
  it), function calls and outputs as they were; image parts are not replayed.
- `detach(protocol)`: the socket dropped: a reply that was streaming ends `cancelled`, and its item
  is truncated to the audio already sent (the model forgets the rest, as after
  `conversation.item.truncate`).
- `resumed(protocol, kv)`: `session.created` (the same id) then `sglang.session.resumed`
  {session_id, items, kv}.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from session_server.realtime.conversation import Item
from session_server.realtime.events import ConversationItemTruncate
from graph.messages import Command
from session_server.realtime.protocol import Action, RealtimeProtocol, ResponseState, SendToGraph, _history_key
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
        "items": [dataclasses.asdict(item) for item in protocol.items.values()],
    }


def restore(protocol: RealtimeProtocol, snapshot: dict[str, Any]) -> list[SendToGraph]:
    """Put the snapshot's session into `protocol` (new, not yet opened); returns the commands
    that replay its conversation into the graph, in order."""
    served = protocol.config.served
    protocol.config = dataclasses.replace(msgspec.convert(snapshot["config"], SessionConfig), served=served)
    protocol.negotiation = msgspec.convert(snapshot.get("negotiation") or {}, Negotiation)
    protocol.items.clear()
    for fields in snapshot["items"]:
        item = Item(**fields)
        protocol.items[item.id] = item
    protocol._turns_processed = bool(protocol.items)
    replay = []
    for item in protocol.items.values():
        args = _replay_args(item)
        if args is not None:
            replay.append(SendToGraph(Command(target="dialog", name="add_item", args=args)))
    return replay


def _replay_args(item: Item) -> dict[str, Any] | None:
    key = _history_key(item)  # a reply's item by its response id, as the model's history names it
    if item.type == "function_call":
        return {"item_id": key, "role": "assistant", "call": {"name": item.name, "arguments": item.arguments or "{}"}}
    if item.type == "function_call_output":
        return {"item_id": key, "role": "tool", "text": item.output or ""}
    texts = [part.get("text") or part.get("transcript") or "" for part in item.content]
    text = "\n".join(t for t in texts if t)
    return {"item_id": key, "role": item.role, "text": text} if text else None


def detach(protocol: RealtimeProtocol) -> list[Action]:
    """The client's socket dropped (the session stays open for a resume)."""
    for response in reversed(list(protocol.responses.values())):
        item = response.item
        if response.state is ResponseState.IN_PROGRESS:
            protocol._cancel(response, "client_disconnected")
            if item is not None and item.id in protocol.items and response.audio:
                sent_ms = int(item.audio_ms)
                protocol._on_ConversationItemTruncate(ConversationItemTruncate(item_id=item.id, audio_end_ms=sent_ms))
        else:
            protocol._finish(response, "cancelled")
    return protocol._flush()


def resumed(protocol: RealtimeProtocol, kv: str) -> list[Action]:
    actions = protocol.open()
    protocol._send("sglang.session.resumed", session_id=protocol.session_id,
                   items=[item.to_wire() for item in protocol.items.values()], kv=kv)
    return actions + protocol._flush()
