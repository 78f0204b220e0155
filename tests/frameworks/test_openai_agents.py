"""openai-agents 0.24.0 (RealtimeAgent / RealtimeRunner) works against the server unchanged.

drivers/drive_openai_agents.py: a RealtimeAgent with a `get_weather` function tool, run by a
RealtimeRunner with `model_config={"url": ..., "api_key": ...}` and the session settings in
`RealtimeRunConfig.model_settings`; text with `send_message`, audio with `send_audio`, new
instructions with `update_agent`, the forced call as a raw `response.create` with `tool_choice`
(the SDK runs the tool and answers on its own); history from `history_updated`/`history_added`.
"""

from tests.frameworks.spec import AgentFrameworkSteps


class TestOpenAIAgents(AgentFrameworkSteps):
    framework = "openai-agents"
