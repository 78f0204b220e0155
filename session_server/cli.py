"""`sgl-omni`: serve, and the tools around it.

    sgl-omni serve [--config FILE] [--model-path DIR] [--enable-realtime] [--host H] [--port P]
                   [--api-key KEY] [--log-level L] [--shutdown-grace S] [--webrtc-candidates C]
                   [--state-url redis://HOST:PORT/DB] [--voices-url s3://BUCKET/PREFIX]
                   [--realtime-compat sglang-omni-v0] [--server-sched adaptive|batch|normal]
                   [--admin-key KEY] [--otlp-endpoint URL]
                   [--served-model-name NAME [NAME...]] [--sip udp:HOST:PORT]
    sgl-omni make-tiny-checkpoint DIR

`serve` fails fast, before any model loads: the port is bound first (in use: exit 1, one line
naming the port and `--port`), then the whole profile is validated (exit 2, one line per problem,
session_server/profile.py). It logs a ready line with the URLs once the model has warmed up.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
import time
from collections.abc import Coroutine, Sequence
from typing import Any

from graph import sched

log = logging.getLogger("sgl_omni")

# Commands implemented outside the transport layer, reached by name so that session_server
# never imports `nodes` (or torch) itself.
_TOOL_COMMANDS = {
    "make-tiny-checkpoint": ("nodes.qwen3_omni.checkpoint", "make_tiny_checkpoint_main", "build the tiny random Qwen3-Omni checkpoint"),
    "client": ("clients.python.cli", "main", "play a WAV into a realtime session (WebSocket or WebRTC), save the reply, print time to first audio"),
    "bench": ("benchmarks.cli", "main", "benchmark the server: realtime sessions, speech endpoints, direct model compute"),
}


def build_parser() -> argparse.ArgumentParser:
    from session_server.realtime.compat import PRESETS
    from session_server.webrtc.config import CANDIDATE_POLICIES

    parser = argparse.ArgumentParser(prog="sgl-omni", description="Realtime session server for speech-to-speech models")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the server")
    serve.add_argument("--config", help="profile YAML (a path, or a shipped profile name); default: the embedded CPU profile")
    serve.add_argument("--model-path", help="checkpoint directory (or cached Hugging Face id) overriding the profile's")
    serve.add_argument("--enable-realtime", action="store_true", help="serve realtime sessions (/v1/realtime, WebRTC)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=os.environ.get("SGL_OMNI_API_KEY"), help="require this Bearer key (env SGL_OMNI_API_KEY)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--state-url", help="redis://HOST:PORT/DB: session snapshots and the session -> replica map in Redis, "
                       "so sessions resume on any replica (the profile's state.url); default: this process only")
    serve.add_argument("--voices-url", help="s3://BUCKET/PREFIX: the voice registry on S3-compatible storage, shared by "
                       "replicas (the profile's speech.voices_url; AWS_* environment); default: a local directory")
    serve.add_argument("--realtime-compat", choices=PRESETS,
                       help="what a realtime WebSocket client that does not say which dialect it speaks gets (the "
                            "profile's realtime.compat): sglang-omni-v0 = sglang-omni v0.1.1's beta events, text "
                            "replies and user transcripts by default; default: OpenAI Realtime GA")
    serve.add_argument("--served-model-name", nargs="+", metavar="NAME",
                       help="the model names clients may ask for (the profile's served_model_names, replaced): the first "
                            "is echoed where a client names none and listed first by /v1/models; default: the profile's")
    serve.add_argument("--sip", metavar="udp:HOST:PORT",
                       help="answer SIP calls here as realtime sessions (the profile's sip.listen; needs --enable-realtime; "
                            "docs/telephony.md); default: the profile's, none")
    serve.add_argument("--shutdown-grace", type=float, help="seconds in-flight replies get on SIGTERM (default: the profile's limits)")
    serve.add_argument("--server-sched", choices=sched.POLICIES, default=sched.SERVER_DEFAULT,
                       help="the server process's CPU scheduling on Linux, with engine processes: batch (SCHED_BATCH: its "
                            "wake-ups, one per client message, do not preempt an engine mid-computation), normal (it forwards "
                            "at once, even woken on a core an engine holds), or adaptive (the default: normal while most "
                            "cores are idle, batch once they are busy); the engines keep the normal policy")
    # Operators: the admin API (session_server/admin.py) and traces (session_server/tracing.py).
    serve.add_argument("--admin-key", default=os.environ.get("SGL_OMNI_ADMIN_KEY"),
                       help="serve the admin API (/v1/admin/sessions) behind this Bearer key, which must differ from "
                            "--api-key (env SGL_OMNI_ADMIN_KEY); default: no admin API")
    serve.add_argument("--otlp-endpoint",
                       help="send OpenTelemetry traces of realtime turns to this OTLP/HTTP base URL (e.g. "
                            "http://collector:4318; the standard OTEL_EXPORTER_OTLP_ENDPOINT works too); needs the "
                            "`otel` extra; default: no traces")
    serve.add_argument(
        "--webrtc-candidates", choices=CANDIDATE_POLICIES,
        help="host ICE candidates of WebRTC calls (the profile's webrtc.candidates); default: the profile's, "
             "else host+loopback when bound to a loopback address (a browser on this machine), else host",
    )

    for name, (_, _, help_text) in _TOOL_COMMANDS.items():
        tool = commands.add_parser(name, help=help_text, add_help=False)
        tool.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _TOOL_COMMANDS:
        # Dispatched before parsing: argparse's REMAINDER drops a tool's leading `--options`.
        module, function, _ = _TOOL_COMMANDS[argv[0]]
        return int(getattr(importlib.import_module(module), function)(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    if args.command in _TOOL_COMMANDS:
        module, function, _ = _TOOL_COMMANDS[args.command]
        return int(getattr(importlib.import_module(module), function)(args.args) or 0)
    return serve(args)


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from session_server.server import PortUnavailable, bound_socket

    try:
        sock = bound_socket(args.host, args.port)
    except PortUnavailable as exc:
        log.error("%s", exc)
        return 1
    try:
        return _serve_on(sock, args)
    finally:
        sock.close()


def _serve_on(sock, args: argparse.Namespace) -> int:
    from configs import ProfileError, load_profile, override_model_path, serves_embedded_checkpoint
    from graph.engine_client import EngineRuntime
    from graph.runtime import GraphRuntime
    from session_server.profile import ProfileInvalid, validated_profile

    started = time.perf_counter()
    try:
        profile = load_profile(args.config)
        if args.model_path:
            if override_model_path(profile, args.model_path) == 0:
                raise ProfileError("--model-path: the profile has no resource with a `path` to override")
        if args.shutdown_grace is not None:
            profile.setdefault("limits", {})["shutdown_grace_s"] = args.shutdown_grace
        _set_webrtc_candidates(profile, args)
        _set_section_flags(profile, args)
        _set_served_model_names(profile, args)
        spec = validated_profile(profile)
    except ProfileError as exc:
        log.error("%s", exc)
        return 2
    except ProfileInvalid as exc:
        for line in exc.lines:
            log.error("invalid profile: %s", line)
        return 2
    log.info("profile %s validated in %.2fs", args.config or "embedded_cpu.yaml", time.perf_counter() - started)
    if serves_embedded_checkpoint(profile):
        log.info("note: serving the embedded tiny test model (random weights): its replies are no real answers and "
                 "its voice is noise, though every stage runs; --model-path DIR serves a real checkpoint")

    # Operators: checked before anything loads, as the profile is.
    args.admin_key = args.admin_key or None  # an empty SGL_OMNI_ADMIN_KEY: no admin API
    if args.admin_key is not None and args.admin_key == args.api_key:
        log.error("--admin-key: the admin key must differ from the client API key (--api-key)")
        return 2
    if (why := _sip_unavailable(profile, args.enable_realtime)) is not None:
        log.error("%s", why)
        return 1 if why.startswith("--sip: cannot") else 2
    from session_server.tracing import TracingUnavailable, from_settings

    try:
        tracing = from_settings(args.otlp_endpoint)
    except TracingUnavailable as exc:
        log.error("--otlp-endpoint: %s", exc)
        return 2

    from session_server.app import create_app
    from session_server.metrics import ServerMetrics
    from session_server.server import run_blocking, run_server
    from session_server.state import ServerState, Settings

    # With no engine processes the server computes itself: nothing to yield to.
    server_sched = args.server_sched if spec.compute_engines else None
    if server_sched in sched.THREAD_POLICIES:
        _set_server_sched(server_sched)
    metrics = ServerMetrics()
    runtime = EngineRuntime(spec, profile, metrics, args.log_level) if spec.compute_engines else GraphRuntime(spec, metrics)
    log.info("listening on http://%s:%d; loading the model (/health answers 503 until ready)", args.host, args.port)
    settings = Settings(model_id=runtime.model_id, api_key=args.api_key, enable_realtime=args.enable_realtime, profile=profile,
                        admin_key=args.admin_key)
    state = ServerState(runtime, settings, metrics)
    state.tracing = tracing
    serving = run_server(state, create_app, args.host, args.port, args.log_level, sock=sock)
    return run_blocking(_following_machine_load(serving) if server_sched == "adaptive" else serving)


def _set_server_sched(policy: str) -> None:
    """Before the engines start: they inherit the policy and put themselves back (graph/sched.py)."""
    if sched.apply(policy) != policy:
        log.warning("--server-sched %s is not available here; the server keeps the normal policy", policy)


async def _following_machine_load(serving: Coroutine[Any, Any, int]) -> int:
    """`--server-sched adaptive`: the server's threads switch policy with the machine's load."""
    follower = asyncio.create_task(sched.follow_machine_load())
    try:
        return await serving
    finally:
        follower.cancel()


def _set_webrtc_candidates(profile: dict, args: argparse.Namespace) -> None:
    """`--webrtc-candidates` wins; else the profile's; else loopback too when only this machine can connect."""
    section = profile.get("webrtc")
    if args.webrtc_candidates is None and isinstance(section, dict) and "candidates" in section:
        return
    chosen = args.webrtc_candidates or ("host+loopback" if _is_loopback_host(args.host) else "host")
    if section is None:
        profile["webrtc"] = section = {}
    if isinstance(section, dict):  # anything else is reported by validation
        section["candidates"] = chosen


def _set_section_flags(profile: dict, args: argparse.Namespace) -> None:
    """`--state-url`, `--voices-url`, `--realtime-compat` and `--sip` win over the profile's
    `state.url`, `speech.voices_url`, `realtime.compat` and `sip.listen`."""
    for value, section, key in ((args.state_url, "state", "url"), (args.voices_url, "speech", "voices_url"),
                                (args.realtime_compat, "realtime", "compat"), (getattr(args, "sip", None), "sip", "listen")):
        if value is None:
            continue
        if profile.get(section) is None:
            profile[section] = {}
        if isinstance(profile[section], dict):  # anything else is reported by validation
            profile[section][key] = value


def _sip_unavailable(profile: dict, enable_realtime: bool) -> str | None:
    """The SIP endpoint's address checked before anything loads, as the HTTP port is: one line."""
    import socket

    from session_server.telephony.config import TelephonyConfig

    listen = TelephonyConfig.from_profile(profile).listen  # validated with the profile already
    if listen is None:
        return None
    if not enable_realtime:
        return "--sip: SIP calls are realtime sessions: add --enable-realtime"
    try:
        with socket.socket(socket.AF_INET6 if ":" in listen[0] else socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(listen)
    except OSError as exc:
        return f"--sip: cannot listen on udp:{listen[0]}:{listen[1]}: {exc.strerror} (choose another address with --sip)"
    return None


def _set_served_model_names(profile: dict, args: argparse.Namespace) -> None:
    """`--served-model-name` replaces the profile's `served_model_names` (session_server/model_names.py)."""
    if args.served_model_name:
        profile["served_model_names"] = list(args.served_model_name)


def _is_loopback_host(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


if __name__ == "__main__":
    sys.exit(main())
