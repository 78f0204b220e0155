"""A test-only reply node for Live sessions: the fake reply of tests/realtime/fakes.py that also
delegates, so a delegation round trip needs no model.

`test.delegating_reply` answers as `test.fake_reply` does, except: a reply to a turn whose text
asks to `delegate` (or whose audio is a spoken turn, with `delegate_spoken`) calls the `delegate`
tool with the task `look up the weather` instead of speaking; and the reply after a function's
output speaks that output, word by word, so a test sees the model go on from the client's answer.
"""

from __future__ import annotations

import json

from graph.messages import AudioOut, FunctionCall, Message, TextDelta, Turn, TurnDone
from graph.registry import register_node
from tests.realtime.fakes import FakeReply, FakeReplySession, realtime_profile, tone

TASK = "look up the weather"


@register_node("test.delegating_reply")
class DelegatingReply(FakeReply):
    def open_session(self, session):
        self.live.add(session.session_id)
        return DelegatingReplySession(self, session)


class DelegatingReplySession(FakeReplySession):
    def __init__(self, node, session):
        super().__init__(node, session)
        self.asked_to_delegate = False
        self.tool_output: str | None = None

    async def on_message(self, stream: str, message: Message, emit) -> None:
        assert isinstance(message, Turn)
        if message.role == "tool":
            self.turns.append(message)
            self.tool_output = message.text
            return
        if message.text and "delegate" in message.text:
            self.asked_to_delegate = True
        reply = message.reply
        if reply is None:
            await super().on_message(stream, message, emit)
            return
        if self.asked_to_delegate and any(tool.get("name") == "delegate" for tool in reply.tools):
            self.asked_to_delegate = False
            self.turns.append(message)
            await emit("out", FunctionCall(turn_id=message.turn_id, response_id=reply.response_id, name="delegate",
                                           arguments=json.dumps({"task": TASK})))
            await emit("out", TurnDone(turn_id=message.turn_id, response_id=reply.response_id, status="completed"))
            return
        if self.tool_output is not None:
            said, self.tool_output = self.tool_output, None
            self.turns.append(message)
            await emit("out", TextDelta(turn_id=message.turn_id, response_id=reply.response_id, text=said, token_ids=(0,)))
            await emit("out", AudioOut(turn_id=message.turn_id, response_id=reply.response_id, samples=tone(100, 440.0)))
            await emit("out", TurnDone(turn_id=message.turn_id, response_id=reply.response_id, status="completed", transcript=said))
            return
        await super().on_message(stream, message, emit)


def live_profile(**reply: object) -> dict:
    profile = realtime_profile(reply={"words": 3, "chunk_ms": 100, **reply})
    profile["imports"] = [*profile["imports"], "tests.live.fakes"]
    profile["nodes"]["reply"]["type"] = "test.delegating_reply"
    return profile
