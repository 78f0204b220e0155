"""What a new user sees when starting the server: fast clear failures, a ready line, the model note."""

import argparse
import logging
import signal
import socket
import subprocess
import sys

import yaml

from configs import load_profile, serves_embedded_checkpoint
from session_server.cli import _set_webrtc_candidates, build_parser
from session_server.server import ready_message
from tests.conftest import REPO, free_port, serve_process
from tests.graph.fakes import relay_sink_profile


def serve_command(config, port, *extra):
    return [sys.executable, "-m", "session_server.cli", "serve", "--config", str(config), "--port", str(port), *extra]


def test_a_port_in_use_fails_before_the_profile_loads_naming_the_port_and_the_flag(tmp_path):
    config = tmp_path / "ok.yaml"
    config.write_text(yaml.safe_dump(relay_sink_profile()))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(serve_command(config, port), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr
    assert "--port" in result.stderr
    assert "validated" not in result.stderr and "Traceback" not in result.stderr


def test_serve_logs_a_ready_line_with_the_urls_once_the_model_is_ready(tmp_path):
    config = tmp_path / "ok.yaml"
    config.write_text(yaml.safe_dump(relay_sink_profile()))
    port = free_port()
    with serve_process(config, port) as process:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    lines = output.splitlines()
    ready = next(i for i, line in enumerate(lines) if "ready: open" in line)
    assert f"http://127.0.0.1:{port}/ (playground)" in lines[ready]
    assert f"ws://127.0.0.1:{port}/v1/realtime" in lines[ready]
    assert ready > next(i for i, line in enumerate(lines) if "ready in" in line)
    assert "Uvicorn running" not in output  # uvicorn's line came before the model had loaded
    assert "embedded tiny test model" not in output  # the fake profile loads no embedded checkpoint


def test_the_ready_line_without_realtime_says_how_to_turn_it_on():
    assert "add --enable-realtime" in ready_message("127.0.0.1", 8000, realtime=False)
    assert "http://127.0.0.1:8000/" in ready_message("0.0.0.0", 8000, realtime=True)


def test_the_embedded_default_is_announced_as_random_weights_and_a_real_checkpoint_is_not():
    profile = load_profile("embedded_cpu")
    assert serves_embedded_checkpoint(profile)
    profile["resources"]["omni"]["params"]["path"] = "/models/Qwen3-Omni"
    assert not serves_embedded_checkpoint(profile)
    assert not serves_embedded_checkpoint(load_profile("qwen3_omni_random_h200"))


class Recorder(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_the_rope_parameters_warning_of_qwen3_omni_is_silenced_and_others_are_kept():
    import nodes.qwen3_omni.model  # noqa: F401 - installs the filter
    from transformers.modeling_rope_utils import logger

    recorder = Recorder()
    logger.addHandler(recorder)  # transformers' loggers do not propagate to the root (caplog)
    try:
        logger.warning("Unrecognized keys in `rope_parameters` for 'rope_type'='default': {'interleaved', 'mrope_section'}")
        logger.warning("Unrecognized keys in `rope_parameters` for 'rope_type'='default': {'factr'}")
    finally:
        logger.removeHandler(recorder)
    assert [m.rsplit(":", 1)[-1].strip() for m in recorder.messages] == ["{'factr'}"]


def candidates_for(*argv, profile=None):
    args = build_parser().parse_args(["serve", *argv])
    profile = profile if profile is not None else {}
    _set_webrtc_candidates(profile, args)
    return profile["webrtc"]["candidates"]


def test_webrtc_candidates_include_loopback_by_default_on_a_loopback_host():
    assert candidates_for() == "host+loopback"
    assert candidates_for("--host", "localhost") == "host+loopback"
    assert candidates_for("--host", "0.0.0.0") == "host"


def test_the_webrtc_candidates_flag_overrides_the_profile_and_the_profile_the_default():
    assert candidates_for("--webrtc-candidates", "loopback", profile={"webrtc": {"candidates": "host"}}) == "loopback"
    assert candidates_for(profile={"webrtc": {"candidates": "host"}}) == "host"
    assert candidates_for("--host", "0.0.0.0", "--webrtc-candidates", "host+loopback") == "host+loopback"


def test_the_webrtc_candidates_flag_accepts_only_the_policies(capsys):
    try:
        build_parser().parse_args(["serve", "--webrtc-candidates", "lan"])
    except SystemExit as exit:
        assert exit.code == 2
    assert "host+loopback" in capsys.readouterr().err
    assert isinstance(build_parser().parse_args(["serve"]), argparse.Namespace)
