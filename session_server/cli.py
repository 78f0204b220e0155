"""`sgl-omni`: serve, and the tools around it.

    sgl-omni serve [--config FILE] [--model-path DIR] [--enable-realtime] [--host H] [--port P]
                   [--api-key KEY] [--log-level L] [--shutdown-grace S]
    sgl-omni make-tiny-checkpoint DIR
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from collections.abc import Sequence

log = logging.getLogger("sgl_omni")

# Commands implemented outside the transport layer, reached by name so that session_server
# never imports `nodes` (or torch) itself.
_TOOL_COMMANDS = {
    "make-tiny-checkpoint": ("nodes.qwen3_omni.checkpoint", "make_tiny_checkpoint_main", "build the tiny random Qwen3-Omni checkpoint"),
    "client": ("clients.python.cli", "main", "play a WAV into a realtime session (WebSocket or WebRTC), save the reply, print time to first audio"),
    "bench": ("benchmarks.cli", "main", "benchmark the server: realtime sessions, speech endpoints, direct model compute"),
}


def build_parser() -> argparse.ArgumentParser:
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
    serve.add_argument("--shutdown-grace", type=float, help="seconds in-flight replies get on SIGTERM (default: the profile's limits)")

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
    from configs import ProfileError, load_profile, override_model_path
    from graph.engine_client import EngineRuntime
    from graph.runtime import GraphRuntime, validated_spec
    from graph.spec import GraphConfigError

    started = time.perf_counter()
    try:
        profile = load_profile(args.config)
        if args.model_path:
            if override_model_path(profile, args.model_path) == 0:
                raise ProfileError("--model-path: the profile has no resource with a `path` to override")
        if args.shutdown_grace is not None:
            profile.setdefault("limits", {})["shutdown_grace_s"] = args.shutdown_grace
        from session_server.metrics import ServerMetrics

        metrics = ServerMetrics()
        spec = validated_spec(profile)
        runtime = EngineRuntime(spec, profile, metrics, args.log_level) if spec.compute_engines else GraphRuntime(spec, metrics)
    except (ProfileError, GraphConfigError) as exc:
        log.error("invalid profile: %s", exc)
        return 2
    log.info("profile %s validated in %.2fs", args.config or "embedded_cpu.yaml", time.perf_counter() - started)

    from session_server.app import create_app
    from session_server.server import run_blocking, run_server
    from session_server.state import ServerState, Settings

    settings = Settings(model_id=runtime.model_id, api_key=args.api_key, enable_realtime=args.enable_realtime, profile=profile)
    state = ServerState(runtime, settings, metrics)
    return run_blocking(run_server(state, create_app, args.host, args.port, args.log_level))


if __name__ == "__main__":
    sys.exit(main())
