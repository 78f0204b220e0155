"""livekit-agents 1.8.9 + livekit-plugins-openai 1.8.9 (`openai.realtime.RealtimeModel(base_url=...)`)
work against the server unchanged.

drivers/drive_livekit.py: the model's RealtimeSession without a room, driven as livekit's
AgentActivity drives it: `update_instructions`/`update_tools`, text as a chat-context message then
`generate_reply` (the first item synced after "root"; `instructions: null`), audio by
`push_audio`, barge-in as `interrupt` + `truncate`, the forced call by
`generate_reply(tool_choice=get_weather)`, run with `execute_function_call`, its output sent by
`update_chat_ctx`; history is the session's `chat_ctx`.
"""

from tests.frameworks.spec import AgentFrameworkSteps


class TestLivekit(AgentFrameworkSteps):
    framework = "livekit"
