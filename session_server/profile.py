"""The whole profile checked before anything loads: the graph, and every section a feature reads.

`profile_errors(profile)` returns one line per problem, each naming its key (and the allowed
values where there is a fixed set); `sgl-omni serve` prints them and exits 2 before the port
opens or a model loads. It checks:

- the graph (graph/spec.py: structure, node types, streams, cycles, every node's and resource's
  `params` against its typed schema, `warmup:`);
- the top-level keys: the graph's, and the sections the feature packages read (`speech:`,
  `webrtc:`, `realtime:`, `state:`, `sip:`, and `served_model_names:`, model_names.py); anything else is a typo (`limit:` for `limits:`) and is refused;
- each feature section with the loader its package uses at startup, so a section that passes
  here cannot fail later.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from graph.runtime import validated_spec
from graph.spec import GRAPH_SECTIONS, GraphConfigError, GraphConfigErrors, GraphSpec


def _webrtc(profile: dict[str, Any]) -> None:
    from session_server.webrtc.config import WebRTCConfig

    WebRTCConfig.from_profile(profile)


def _speech(profile: dict[str, Any]) -> None:
    from session_server.speech.service import SpeechConfig

    SpeechConfig.from_profile(profile)


def _realtime(profile: dict[str, Any]) -> None:
    from session_server.realtime.websocket_link import RealtimeSettings

    RealtimeSettings.from_profile(profile)


def _state(profile: dict[str, Any]) -> None:
    from session_server.realtime.session_store import StateConfig

    StateConfig.from_profile(profile)


def _served_model_names(profile: dict[str, Any]) -> None:
    from session_server.model_names import check_profile

    check_profile(profile)


def _sip(profile: dict[str, Any]) -> None:
    from session_server.telephony.config import TelephonyConfig

    TelephonyConfig.from_profile(profile)


# Section -> its package's loader (raises ValueError with one line naming the key).
FEATURE_SECTIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "speech": _speech, "webrtc": _webrtc, "realtime": _realtime, "state": _state,
    "served_model_names": _served_model_names,
    "sip": _sip,  # phone calls (session_server/telephony/)
}


class ProfileInvalid(ValueError):
    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def validated_profile(profile: dict[str, Any]) -> GraphSpec:
    """The profile's graph spec, or ProfileInvalid listing every problem found."""
    spec, lines = _check(profile)
    if lines:
        raise ProfileInvalid(lines)
    assert spec is not None
    return spec


def profile_errors(profile: dict[str, Any]) -> list[str]:
    return _check(profile)[1]


def _check(profile: dict[str, Any]) -> tuple[GraphSpec | None, list[str]]:
    lines: list[str] = []
    known = sorted(GRAPH_SECTIONS | set(FEATURE_SECTIONS))
    for key in profile:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean `{close[0]}`? " if close else ""
            lines.append(f"{key}: unknown top-level key ({hint}known: {', '.join(known)})")
    spec = None
    try:
        spec = validated_spec(profile)
    except GraphConfigErrors as exc:
        lines += exc.lines
    except GraphConfigError as exc:
        lines.append(str(exc))
    except ImportError as exc:  # an `imports:` entry that is not a module
        lines.append(f"imports: cannot import {exc.name or exc}")
    for section, load in FEATURE_SECTIONS.items():
        try:
            load(profile)
        except ValueError as exc:
            lines.append(str(exc))
    return spec, lines
