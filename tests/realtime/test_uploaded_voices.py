"""A realtime session may name an uploaded voice: it is echoed by its name and spoken by the built-in
speaker it was matched to at upload (at the protocol core, with a stand-in for the registry)."""

from __future__ import annotations

import json

from graph.messages import Command, Configure, CreateResponse
from session_server.realtime.events import RealtimeError
from session_server.realtime.protocol import RealtimeProtocol, SendEvent, SendToGraph
from session_server.realtime.session_config import ServedModel
from session_server.realtime.snapshot import restore, snapshot_of

UPLOADED = {"narrator": "chelsie", "old-voice": None}  # old-voice: stored without a matched speaker


def uploaded_speaker(name: str) -> str | None:
    if name not in UPLOADED:
        return None
    if UPLOADED[name] is None:
        raise RealtimeError("voice_not_matched", f"Voice '{name}' has no matched speaker; upload it again.")
    return UPLOADED[name]


SERVED = ServedModel("model-x", speakers=("chelsie", "ethan"), default_speaker="ethan", voice_aliases={"alloy": "ethan"},
                     uploaded_speaker=uploaded_speaker)


def opened(served: ServedModel = SERVED) -> RealtimeProtocol:
    protocol = RealtimeProtocol("sess_1", "model-x", served=served)
    protocol.open()
    return protocol


def send(protocol: RealtimeProtocol, **event) -> list:
    return protocol.receive_text(json.dumps(event))


def events(actions) -> list[dict]:
    return [a.event for a in actions if isinstance(a, SendEvent)]


def commands(actions, kind: type[Command]) -> list[Command]:
    return [a.message for a in actions if isinstance(a, SendToGraph) and isinstance(a.message, kind)]


def test_an_uploaded_voice_is_echoed_by_its_name_and_the_graph_is_told_its_speaker():
    protocol = opened()
    actions = send(protocol, type="session.update", session={"type": "realtime", "audio": {"output": {"voice": "narrator"}}})
    [updated] = [e for e in events(actions) if e["type"] == "session.updated"]
    assert updated["session"]["audio"]["output"]["voice"] == "narrator"
    configure = commands(actions, Configure)[-1].config
    assert configure["voice"] == "chelsie" and configure["auto_reply"].voice == "chelsie"
    reply = commands(send(protocol, type="response.create"), CreateResponse)[0].reply
    assert reply.voice == "chelsie"


def test_the_beta_voice_field_names_an_uploaded_voice_too():
    protocol = opened()
    send(protocol, type="session.update", session={"modalities": ["text", "audio"], "voice": "narrator"})
    assert (protocol.config.voice, protocol.config.spoken_voice) == ("narrator", "chelsie")


def test_a_response_may_name_an_uploaded_voice():
    protocol = opened()
    actions = send(protocol, type="response.create", response={"audio": {"output": {"voice": "narrator"}}})
    assert commands(actions, CreateResponse)[0].reply.voice == "chelsie"


def test_other_names_keep_their_rule_an_unknown_one_is_echoed_as_the_default_speaker():
    protocol = opened()
    session = events(send(protocol, type="session.update", session={"audio": {"output": {"voice": "marin"}}}))[-1]["session"]
    assert session["audio"]["output"]["voice"] == "ethan"
    session = events(send(protocol, type="session.update", session={"audio": {"output": {"voice": "Chelsie"}}}))[-1]["session"]
    assert session["audio"]["output"]["voice"] == "chelsie"


def test_an_uploaded_voice_without_a_matched_speaker_is_refused_and_changes_nothing():
    protocol = opened()
    [error] = events(send(protocol, type="session.update", session={"audio": {"output": {"voice": "old-voice"}}, "instructions": "Hi"}))
    assert error["type"] == "error"
    assert (error["error"]["code"], error["error"]["param"]) == ("voice_not_matched", "session.audio.output.voice")
    assert protocol.config.voice is None and protocol.config.instructions == ""


def test_a_session_rebuilt_from_its_snapshot_speaks_as_before_without_asking_the_registry():
    protocol = opened()
    send(protocol, type="session.update", session={"audio": {"output": {"voice": "narrator"}}})
    rebuilt = RealtimeProtocol("sess_1", "model-x", served=ServedModel("model-x", speakers=("chelsie", "ethan"), default_speaker="ethan"))
    restore(rebuilt, json.loads(json.dumps(snapshot_of(protocol, "sha"))))
    assert rebuilt.graph_config()["voice"] == "chelsie"
    assert rebuilt.config.to_wire("sess_1")["audio"]["output"]["voice"] == "narrator"
