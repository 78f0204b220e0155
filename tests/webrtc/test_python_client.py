"""The Python CLI client plays a WAV into a session over WebSocket and over WebRTC."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile

from clients.python import cli
from session_server.cli import main
from tests.conftest import running_server
from tests.webrtc.helpers import API_KEY, dominant_hz, rms, utterance, webrtc_profile


@pytest.mark.parametrize("transport", ["websocket", "webrtc"])
async def test_cli_plays_a_wav_and_writes_the_spoken_reply(transport, tmp_path, capsys):
    question = tmp_path / "question.wav"
    soundfile.write(question, utterance(rate=16000), 16000, subtype="PCM_16")
    reply_path = tmp_path / "reply.wav"
    async with running_server(webrtc_profile(reply={"words": 3, "chunk_ms": 300}), api_key=API_KEY) as server:
        args = cli.parse_args(
            ["--url", server.base_url, "--api-key", API_KEY, "--input", str(question), "--output", str(reply_path), "--transport", transport, "--loopback"]
        )
        assert await cli.run(args) == 0
    printed = capsys.readouterr().out
    assert "input_audio_buffer.speech_stopped" in printed and "response.done completed" in printed
    assert "time to first audio: " in printed and "time to first audio: n/a" not in printed
    reply, rate = soundfile.read(reply_path, dtype="float32")
    assert rate == 24000
    # three 300 ms tones from the fake reply node
    assert 0.8 <= len(reply) / rate <= 1.2, len(reply) / rate
    assert rms(reply) > 0.1 and 420 <= dominant_hz(reply[: rate // 4], rate) <= 500
    print(printed.splitlines()[-1])


def test_sgl_omni_has_a_client_command(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["client", "--url", "http://127.0.0.1:1", "--help"])
    assert exited.value.code == 0
    assert "--transport {websocket,webrtc}" in capsys.readouterr().out


async def test_microphone_input_says_what_it_needs_when_unavailable(tmp_path, capsys):
    try:
        import sounddevice  # noqa: F401
    except (ImportError, OSError):
        pass
    else:
        pytest.skip("sounddevice is installed here; this test covers its absence")
    args = cli.parse_args(["--input", "mic", "--output", str(tmp_path / "r.wav")])
    assert await cli.run(args) == 2
    assert "sounddevice" in capsys.readouterr().err
