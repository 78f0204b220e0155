"""A realtime session may name an uploaded voice: it is echoed by its name and spoken by the built-in
speaker it was matched to at upload (at the protocol core, with a stand-in for the registry)."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

from graph.messages import Command, Configure, CreateResponse
from session_server.realtime.events import RealtimeError
from session_server.realtime.protocol import RealtimeProtocol, SendEvent, SendToGraph
from session_server.realtime.session_config import ServedModel
from session_server.realtime.snapshot import restore, snapshot_of
from session_server.speech.params import SpeechError
from tests.conftest import running_server
from tests.realtime.client import API_KEY, raw_client
from tests.realtime.fakes import realtime_profile

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


# ---------------------------------------------------------------- lookups off the event loop


class CountingRegistry:
    """The stand-in registry, counting its lookups and recording the threads they ran in."""

    def __init__(self):
        self.names: list[str] = []
        self.threads: list[int] = []

    def __call__(self, name: str) -> str | None:
        self.names.append(name)
        self.threads.append(threading.get_ident())
        return uploaded_speaker(name)


def counted() -> tuple[RealtimeProtocol, CountingRegistry]:
    registry = CountingRegistry()
    return opened(replace(SERVED, uploaded_speaker=registry)), registry


def test_only_an_event_naming_a_voice_that_may_be_uploaded_needs_a_lookup():
    protocol, registry = counted()
    update = {"type": "session.update", "session": {"audio": {"output": {"voice": "narrator"}}}}
    assert protocol.voices_to_look_up(json.dumps(update)) == ["narrator"]
    assert protocol.voices_to_look_up({"type": "response.create", "response": {"voice": {"id": "narrator"}}}) == ["narrator"]
    for voice in ("alloy", "Chelsie"):  # an alias, a built-in speaker: no registry
        assert protocol.voices_to_look_up({"type": "session.update", "session": {"voice": voice}}) == []
    assert protocol.voices_to_look_up(json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA"})) == []
    assert protocol.voices_to_look_up('{"type": "session.update", "session": {"voice": ') == []  # not JSON: refused later
    without_uploads = opened(ServedModel("model-x", speakers=("chelsie", "ethan")))
    assert without_uploads.voices_to_look_up(json.dumps(update)) == []
    assert registry.names == []


def test_a_voice_looked_up_ahead_in_a_worker_thread_is_not_looked_up_again_on_the_loop():
    protocol, registry = counted()
    text = json.dumps({"type": "session.update", "session": {"audio": {"output": {"voice": "narrator"}}}})
    worker = threading.Thread(target=lambda: [protocol.look_up_voice(n) for n in protocol.voices_to_look_up(text)])
    worker.start()
    worker.join()
    actions = protocol.receive_text(text)
    assert commands(actions, Configure)[-1].config["voice"] == "chelsie"
    assert registry.names == ["narrator"] and registry.threads == [worker.ident]
    # The answer served that event only: the next one asks again (the voice may have changed meanwhile).
    send(protocol, type="response.create", response={"voice": "narrator"})
    assert registry.names == ["narrator", "narrator"]


def test_a_refusal_looked_up_ahead_is_the_events_error_in_the_protocols_shape():
    protocol, registry = counted()
    text = json.dumps({"type": "session.update", "session": {"audio": {"output": {"voice": "old-voice"}}}})
    for name in protocol.voices_to_look_up(text):
        protocol.look_up_voice(name)
    [error] = events(protocol.receive_text(text))
    assert (error["error"]["code"], error["error"]["param"]) == ("voice_not_matched", "session.audio.output.voice")
    assert registry.names == ["old-voice"] and protocol.config.voice is None


class SpeechRegistry(CountingRegistry):
    """As the speech package answers (session_server/speech/params.py `uploaded_speaker`)."""

    def __call__(self, name: str) -> str | None:
        try:
            return super().__call__(name)
        except RealtimeError as error:
            raise SpeechError(400, error.message, "voice", error.code) from None


async def test_the_websocket_looks_uploaded_voices_up_off_the_event_loop():
    registry = SpeechRegistry()
    async with running_server(realtime_profile(), api_key=API_KEY) as srv:
        srv.state.uploaded_speaker = registry
        srv.state.served = None  # read again, with this registry, by the next session
        loop_thread = threading.get_ident()
        async with raw_client(srv) as client:
            await client.recv()
            await client.send({"type": "session.update", "session": {"audio": {"output": {"voice": "narrator"}}}})
            updated = (await client.until("session.updated"))[-1]
            assert updated["session"]["audio"]["output"]["voice"] == "narrator"
            await client.send({"type": "session.update", "session": {"audio": {"output": {"voice": "old-voice"}}}})
            assert (await client.error())["code"] == "voice_not_matched"
    assert registry.names == ["narrator", "old-voice"]
    assert loop_thread not in registry.threads
