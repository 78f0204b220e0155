"""Stateless speech on the loaded graph (the vLLM-Omni Speech API, OpenAI-compatible).

    POST   /v1/audio/speech          routes.py   whole file, SSE, or raw audio stream
    POST   /v1/audio/speech/batch    batch.py    1..32 items, per-item results
    GET    /v1/audio/voices          voices.py   built-in speakers + uploaded voices
    POST   /v1/audio/voices          voices.py   upload (multipart), matched to a built-in speaker (voice_match.py)
    DELETE /v1/audio/voices/{name}   voices.py
    WS     /v1/audio/speech/stream   stream_ws.py  streaming text in, audio out

How a request runs on the graph, and why live sessions always go first: `service.py`.
Settings: the profile's optional `speech:` section (`service.SpeechConfig`).
"""

from __future__ import annotations

from fastapi import FastAPI

from session_server.speech.service import SpeechConfig, SpeechService


def install(app: FastAPI, state) -> SpeechService:
    from session_server.speech.batch import install_batch_route
    from session_server.speech.params import uploaded_speaker
    from session_server.speech.routes import install_speech_route
    from session_server.speech.stream_ws import install_stream_route
    from session_server.speech.voices import VOICE_FORM_OVERHEAD, install_voice_routes

    service = SpeechService(state.runtime, SpeechConfig.from_profile(state.settings.profile or {}), state.metrics,
                            sessions=state.sessions, model_names=state.settings.model_names)
    app.state.speech = service
    state.uploaded_speaker = lambda name: uploaded_speaker(name, service)  # realtime sessions use uploaded voices too
    install_speech_route(app, service)
    install_batch_route(app, service)
    install_voice_routes(app, service)
    state.request_size_limits["/v1/audio/voices"] = service.config.voice_max_bytes + VOICE_FORM_OVERHEAD
    install_stream_route(app, service)
    return service
