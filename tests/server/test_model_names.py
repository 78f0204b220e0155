"""Model names and aliases (session_server/model_names.py): `--served-model-name`, the profile's
`served_model_names`, and the embedded default answering OpenAI's realtime and live model names."""

from __future__ import annotations

import json

import httpx
import pytest
import websockets
from openai import AsyncOpenAI

from configs import load_profile
from session_server.cli import _set_served_model_names, build_parser
from session_server.profile import profile_errors
from tests.conftest import running_server
from tests.realtime.client import API_KEY
from tests.realtime.fakes import realtime_profile

OPENAI_NAMES = ["gpt-realtime", "gpt-realtime-2.1", "gpt-realtime-mini", "gpt-4o-realtime-preview", "gpt-live-1", "gpt-live-1.1"]


def aliased(*names: str) -> dict:
    return {**realtime_profile(), "served_model_names": list(names)}


async def first_event(srv, query: str = "") -> dict:
    async with websockets.connect(f"{srv.ws_url}/v1/realtime{query}", additional_headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
        return json.loads(await ws.recv())


async def test_the_embedded_default_answers_openais_model_names_through_the_sdk_and_lists_them():
    async with running_server(load_profile(None), api_key=API_KEY) as srv:
        sdk = AsyncOpenAI(base_url=srv.base_url + "/v1", api_key=API_KEY)
        models = await sdk.models.list()
        echoed = {}
        for name in ("gpt-realtime", "gpt-live-1"):
            async with sdk.realtime.connect(model=name) as conn:
                event = await conn.recv()
                assert event.type == "session.created", event
                echoed[name] = event.session.model
        unnamed = await first_event(srv)

    assert [m.id for m in models.data] == ["qwen3-omni-tiny", *OPENAI_NAMES]
    assert {m.root for m in models.data} == {"qwen3-omni-tiny"}  # the model behind every name (vLLM's field)
    assert echoed == {"gpt-realtime": "gpt-realtime", "gpt-live-1": "gpt-live-1"}  # what the client asked for
    assert unnamed["session"]["model"] == "qwen3-omni-tiny"  # no name asked: the server's own


async def test_an_unknown_model_still_gets_model_not_found_naming_what_is_served():
    async with running_server(aliased("omni", "gpt-realtime"), api_key=API_KEY) as srv:
        error = await first_event(srv, "?model=gpt-5")
    assert error["type"] == "error" and error["error"]["code"] == "model_not_found"
    assert "'omni'" in error["error"]["message"] and "'gpt-realtime'" in error["error"]["message"]


async def test_the_first_served_name_replaces_the_profiles_model_id_everywhere():
    async with running_server(aliased("omni", "gpt-realtime"), api_key=API_KEY) as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            models = (await http.get("/v1/models")).json()["data"]
            health = (await http.get("/health")).json()
        created = await first_event(srv)
        old_name = await first_event(srv, "?model=test-realtime")
    assert [(m["id"], m["root"]) for m in models] == [("omni", "test-realtime"), ("gpt-realtime", "test-realtime")]
    assert health["model"] == "omni" and created["session"]["model"] == "omni"
    assert old_name["error"]["code"] == "model_not_found"  # as vLLM: the served names replace the model's own


def test_the_flag_replaces_the_profiles_names_and_takes_several():
    profile = aliased("omni", "gpt-realtime")
    _set_served_model_names(profile, build_parser().parse_args(["serve", "--served-model-name", "a", "b"]))
    assert profile["served_model_names"] == ["a", "b"]
    untouched = aliased("omni")
    _set_served_model_names(untouched, build_parser().parse_args(["serve"]))
    assert untouched["served_model_names"] == ["omni"]


@pytest.mark.parametrize(("names", "line"), [
    ([], "served_model_names: a list of model names, at least one (got [])"),
    (["a", "a"], "served_model_names[1]: 'a' is listed twice"),
    (["a", ""], "served_model_names[1]: a model name is a non-empty string without surrounding spaces (got '')"),
    ({"a": 1}, "served_model_names: a list of model names, at least one (got {'a': 1})"),
])
def test_a_bad_list_of_names_is_a_profile_error_naming_the_key(names, line):
    assert profile_errors({**realtime_profile(), "served_model_names": names}) == [line]


def test_the_embedded_default_lists_its_names_validly():
    profile = load_profile(None)
    assert profile_errors(profile) == []
    assert profile["served_model_names"] == ["qwen3-omni-tiny", *OPENAI_NAMES]
