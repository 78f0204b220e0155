"""POST /v1/audio/speech/batch: defaults and overrides, partial failure, order, limits."""

import base64

import httpx
import pytest

from tests.speech.conftest import speaker_node
from tests.speech.helpers import any_samples, dominant_hz


async def post_batch(server, body):
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        return await client.post("/v1/audio/speech/batch", json=body)


async def test_batch_defaults_apply_and_items_override_them(server):
    response = await post_batch(
        server,
        {
            "items": [
                {"input": "first item"},
                {"input": "second item", "voice": "chelsie", "response_format": "mp3"},
                {"input": "third item", "sample_rate": 16000},
            ],
            "voice": "aiden",
            "response_format": "wav",
            "instructions": "Speak slowly.",
        },
    )
    assert response.status_code == 200
    body = response.json()
    assert body["id"].startswith("speech-batch-")
    assert (body["total"], body["succeeded"], body["failed"]) == (3, 3, 0)
    first, second, third = body["results"]
    assert [r["media_type"] for r in body["results"]] == ["audio/wav", "audio/mpeg", "audio/wav"]
    samples, rate = any_samples(base64.b64decode(first["audio_data"]), "wav")
    assert abs(dominant_hz(samples, rate) - 440) < 10
    samples, rate = any_samples(base64.b64decode(second["audio_data"]), "mp3")
    assert abs(dominant_hz(samples, rate) - 220) < 10
    assert any_samples(base64.b64decode(third["audio_data"]), "wav")[1] == 16000
    assert all(turn.instructions == "Speak slowly." for turn in speaker_node(server).turns)


async def test_results_come_back_in_input_order_with_usage(server):
    items = [{"input": "word " * n} for n in (6, 1, 4, 2)]
    body = (await post_batch(server, {"items": items, "response_format": "pcm"})).json()
    assert [r["index"] for r in body["results"]] == [0, 1, 2, 3]
    for n, result in zip((6, 1, 4, 2), body["results"]):
        assert len(base64.b64decode(result["audio_data"])) == n * 2 * 2400 * 2
        assert result["usage"] == {
            "input_tokens": n,
            "output_tokens": 2 * n,
            "total_tokens": 3 * n,
            "input_token_details": {"text_tokens": n, "audio_tokens": 0},
        }


async def test_a_bad_item_fails_alone(server):
    body = (
        await post_batch(
            server,
            {
                "items": [
                    {"input": "fine"},
                    {"input": "   "},
                    {"input": "odd voice", "voice": "nobody"},
                    {"input": "this will FAIL"},
                    {"input": "streamed", "stream": True},
                    {"input": "also fine"},
                ]
            },
        )
    ).json()
    assert (body["total"], body["succeeded"], body["failed"]) == (6, 2, 4)
    statuses = [r["status"] for r in body["results"]]
    assert statuses == ["success", "error", "error", "error", "error", "success"]
    empty, voice, failed, streamed = body["results"][1:5]
    assert empty == {"index": 1, "status": "error", "error": "Input text cannot be empty"}
    assert "Invalid voice 'nobody'" in voice["error"]
    assert "fail" in failed["error"]
    assert "Streaming" in streamed["error"]
    assert all("usage" not in r and "audio_data" not in r for r in body["results"][1:5])


@pytest.mark.parametrize("count", [1, 32])
async def test_one_to_thirty_two_items_are_accepted(server, count):
    body = (await post_batch(server, {"items": [{"input": f"item {i}"} for i in range(count)], "response_format": "pcm"})).json()
    assert body["total"] == count and body["succeeded"] == count


async def test_thirty_three_items_are_400_naming_the_limit(server):
    response = await post_batch(server, {"items": [{"input": "x"}] * 33})
    assert response.status_code == 400
    error = response.json()["error"]
    assert "at most 32 items" in error["message"] and error["param"] == "items"


@pytest.mark.parametrize("items", [[], None, "text"])
async def test_missing_or_empty_items_are_400(server, items):
    response = await post_batch(server, {"items": items} if items is not None else {})
    assert response.status_code == 400 and response.json()["error"]["param"] == "items"


async def test_unknown_model_is_404_for_the_whole_batch(server):
    response = await post_batch(server, {"model": "other", "items": [{"input": "x"}]})
    assert response.status_code == 404
    assert response.json()["error"]["message"] == "The model `other` does not exist."


async def test_a_client_leaving_cancels_the_whole_batch(tmp_path):
    import asyncio

    from tests.conftest import running_server
    from tests.speech.conftest import speech_service
    from tests.speech.fake_speaker import speaker_profile
    from tests.conftest import eventually

    async with running_server(speaker_profile(tmp_path, step_delay_s=0.02), enable_realtime=False) as server:
        node = speaker_node(server)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            request = asyncio.create_task(
                client.post("/v1/audio/speech/batch", json={"items": [{"input": "word " * 50}] * 4})
            )
            await eventually(lambda: len(node.steps) == 4, what="the batch items running")
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)
        await eventually(lambda: server.runtime.count("speech") == 0 and len(node.closed) == 4, what="items cancelled")
        assert max(node.steps.values()) < 100 and speech_service(server).active_jobs == set()
