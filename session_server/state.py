"""What every route shares: the runtime, the settings, the metrics, the live sessions, the shutdown flag."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graph.runtime import GraphRuntime, free_slots
from session_server.live_sessions import LiveSessions
from session_server.metrics import ServerMetrics
from session_server.model_names import not_served_message, served_names


@dataclass
class Settings:
    # The name the server echoes: the first of the profile's `served_model_names` where it lists
    # any (`--served-model-name`), else the profile's `model_id` (session_server/model_names.py).
    model_id: str
    api_key: str | None = None
    enable_realtime: bool = True
    # Anything a feature package needs from the profile's top level (e.g. `speech:`, `webrtc:`).
    profile: dict[str, Any] = field(default_factory=dict)
    # The admin API's own key (admin.py; `--admin-key`): None, no admin API.
    admin_key: str | None = None
    # Every name a request may ask for, `model_id` first; read from the profile.
    model_names: tuple[str, ...] = field(init=False)
    # The profile's `model_id`: the model that really answers, whatever it is called here.
    model_root: str = field(init=False)

    def __post_init__(self) -> None:
        self.model_root = self.model_id
        self.model_names = served_names(self.profile or {}, self.model_id)
        self.model_id = self.model_names[0]

    def serves(self, requested: Any) -> bool:
        return isinstance(requested, str) and requested in self.model_names

    def echoed_model(self, requested: Any) -> str:
        """The model a session shows: the one its client asked for when served here, else the first name."""
        return requested if self.serves(requested) else self.model_id

    def not_served(self, requested: Any) -> str:
        return not_served_message(str(requested), self.model_names)


class ServerState:
    def __init__(self, runtime: GraphRuntime, settings: Settings, metrics: ServerMetrics):
        self.runtime = runtime
        self.settings = settings
        self.metrics = metrics
        self.startup_error: str | None = None
        self.served: Any = None  # what realtime sessions are served, read once ready (realtime/served.py)
        # Parks and resumes realtime sessions (realtime/resume.py); set when realtime is installed.
        self.resumer: Any = None
        # name -> the built-in speaker an uploaded voice speaks with, None when no voice has that
        # name (speech/params.py `uploaded_speaker`); set when speech is installed.
        self.uploaded_speaker: Callable[[str], str | None] | None = None
        # Extra credentials a feature may mint (ephemeral client secrets), each good only on
        # the paths it was registered for: (paths, check(key) -> bool).
        self._key_validators: list[tuple[frozenset[str], Callable[[str], bool]]] = []
        # Request-body bounds of paths that need their own (session_server/request_size.py).
        self.request_size_limits: dict[str, int] = {}
        # Every live session, whatever its transport, connected or parked (live_sessions.py).
        self.sessions = LiveSessions()
        # Traces of realtime turns (tracing.py), None unless an OTLP endpoint is configured.
        self.tracing: Any = None

    @property
    def ready(self) -> bool:
        return self.runtime.ready and not self.runtime.shutting_down

    @property
    def shutting_down(self) -> bool:
        return self.runtime.shutting_down

    def free_session_slots(self) -> int:
        """Realtime sessions this server can still admit (parked sessions give their slot up)."""
        if self.resumer is not None:
            return self.resumer.free_slots()
        return free_slots(self.runtime)

    def parked_sessions(self) -> int:
        """Realtime sessions whose client dropped, waiting for a resume (realtime/resume.py)."""
        return len(self.resumer.parked) if self.resumer is not None else 0

    def add_key_validator(self, check: Callable[[str], bool], paths: frozenset[str]) -> None:
        self._key_validators.append((paths, check))

    def key_is_valid(self, key: str | None, path: str) -> bool:
        """True when no key is configured, or `key` is the server key, or a minted key good on `path`."""
        if self.settings.api_key is None:
            return True
        if key is None:
            return False
        if hmac.compare_digest(key.encode(), self.settings.api_key.encode()):
            return True
        return any(check(key) for paths, check in self._key_validators if path in paths)

    def admin_key_is_valid(self, key: str | None) -> bool:
        """True only for the admin key itself (never the client key, never a minted one)."""
        admin_key = self.settings.admin_key
        return admin_key is not None and key is not None and hmac.compare_digest(key.encode(), admin_key.encode())
