"""pipecat-ai 1.14.0 (OpenAIRealtimeLLMService, GA realtime) works against the server unchanged.

drivers/drive_pipecat.py: a pipeline of LLMContextAggregatorPair around the service, no transport;
settings in `OpenAIRealtimeLLMService.Settings` (system_instruction, session_properties with
server VAD, transcription, voice and a ToolsSchema), `get_weather` by `register_function`; the
text turn is the context's first message run by LLMRunFrame, audio is InputAudioRawFrame, new
instructions an LLMUpdateSettingsFrame, the forced call a `response.create` with
`tool_choice: "required"` (pipecat's only forcing choice) sent with `send_client_event`; history is
the LLMContext's user messages. pipecat stops reading on any `error` event or unparseable one.
"""

from tests.frameworks.spec import AgentFrameworkSteps


class TestPipecat(AgentFrameworkSteps):
    framework = "pipecat"
