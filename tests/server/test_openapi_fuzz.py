"""Issue 16: schemathesis against the server's own OpenAPI schema, over a live server (127.0.0.1).

One server with every HTTP route (the fake realtime graph and the fake speaker side by side).
Each operation gets schema-valid and schema-violating requests; every answer must be below 500,
every 4xx in the OpenAI error shape with a code, and a request that violates the schema must be
refused. Bounded: derandomized, a fixed number of examples per operation.
"""

from __future__ import annotations

import asyncio

import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import negative_data_rejection, not_a_server_error

from tests.conftest import running_server
from tests.realtime.fakes import realtime_profile
from tests.speech.fake_speaker import with_speaker

KEY = "sk-test-key"
EXAMPLES_PER_OPERATION = 60


def every_route_profile(voices_dir) -> dict:
    return with_speaker(realtime_profile(), voices_dir)


def assert_openai_error(response: requests.Response) -> None:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, response.text
    assert error["message"] and error["code"], response.text


def fuzz_operation(operation, base_url: str) -> None:
    strategy = st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE))
    headers = {"Authorization": f"Bearer {KEY}"}
    with requests.Session() as session:

        @given(case=strategy)
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def each_case(case) -> None:
            response = case.call(base_url=base_url, session=session, headers=headers, timeout=30)
            case.validate_response(response, checks=[not_a_server_error, negative_data_rejection], headers=headers)
            if response.status_code >= 400:
                assert_openai_error(response)

        each_case()


async def test_every_operation_in_the_openapi_schema_survives_schemathesis(tmp_path):
    async with running_server(every_route_profile(tmp_path / "voices"), api_key=KEY) as server:
        app = server.server.config.app
        # A refusal is any 4xx (413 included: an offer over 64 KiB), never a 2xx or a 5xx.
        config = schemathesis.Config.from_dict({"checks": {"negative_data_rejection": {"expected-statuses": ["4xx"]}}})
        schema = schemathesis.openapi.from_dict(app.openapi(), config=config)
        operations = [result.ok() for result in schema.get_all_operations()]
        # The raw-Request routes declare their bodies: the schema is honest about what they take.
        with_body = {f"{op.method.upper()} {op.path}" for op in operations if op.body}
        assert {"POST /v1/audio/speech", "POST /v1/audio/speech/batch", "POST /v1/audio/voices",
                "POST /v1/realtime/calls", "POST /v1/realtime/client_secrets"} <= with_body
        for operation in operations:
            await asyncio.to_thread(fuzz_operation, operation, server.base_url)
