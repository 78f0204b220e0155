"""`test.fake_reply` that also transcribes: after each reply to an utterance marked
`Turn.transcribe` (the session asked for `audio.input.transcription`) it reports a transcript, as
the thinker's out-of-band pass does (nodes/qwen3_omni/transcription.py), so the page's user
transcripts can be tested without a model. The transcript is the node's `transcript` param."""

from __future__ import annotations

from graph.messages import AudioOut, Message, NodeEvent, TextDelta, TranscriptCompleted, TranscriptDelta, Turn, TurnDone
from graph.registry import register_node
from tests.realtime.fakes import FakeReply, FakeReplySession
from tests.webrtc.helpers import webrtc_profile


@register_node("test.fake_reply_transcribed")
class FakeReplyTranscribed(FakeReply):
    outputs = {"out": (TextDelta, AudioOut, TurnDone, NodeEvent)}

    def open_session(self, session):
        self.live.add(session.session_id)
        return TranscribedSession(self, session)


class TranscribedSession(FakeReplySession):
    async def on_message(self, stream: str, message: Message, emit) -> None:
        await super().on_message(stream, message, emit)
        if isinstance(message, Turn) and message.transcribe is not None and (message.audio is not None or message.confirms is not None):
            # (a confirming turn carries no audio: its early prefill had it, tests/realtime/fakes.py)
            transcript = str(self.node.params.get("transcript", "what is the weather like today in paris"))
            await emit("out", TranscriptDelta(turn_id=message.turn_id, item_id=message.item_id, delta=transcript))
            await emit("out", TranscriptCompleted(turn_id=message.turn_id, item_id=message.item_id, transcript=transcript))


def transcribed_webrtc_profile(reply: dict | None = None, **webrtc) -> dict:
    profile = webrtc_profile(reply=reply, **webrtc)
    profile["imports"].append("tests.webrtc.transcribing_fake")
    profile["nodes"]["reply"]["type"] = "test.fake_reply_transcribed"
    return profile
