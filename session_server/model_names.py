"""The names this server answers to: the served model and its aliases, as vLLM serves them.

`sgl-omni serve --served-model-name NAME [NAME...]`, or the profile's top-level
`served_model_names: [NAME, ...]` (the flag wins, replacing the list; without either the
profile's `model_id` is the one name). A request that names any of them is served: `?model=` of
`/v1/realtime`, a WebRTC call's or client secret's `session.model`, the speech routes' `model`.
Any other name gets `model_not_found`, as before.

The first name is the server's own: `/v1/models` lists it first (then every alias, each with
`root`, the profile's `model_id`: the model that really answers), `/health` names it, and a
session whose client names no model echoes it. A session whose client names an alias echoes
that alias (OpenAI's rule: the session shows the model its client asked for; vLLM echoes its
first name instead): an app written against OpenAI that compares `session.model` with its own
setting keeps working after changing only its base URL, and which model answers is told by
`/v1/models`' `root`, which no client mistakes for OpenAI's.
"""

from __future__ import annotations

from typing import Any

SECTION = "served_model_names"


def served_names(profile: dict[str, Any], model_id: str) -> tuple[str, ...]:
    """The names the profile serves under, first the echoed one (ValueError naming the key)."""
    names = profile.get(SECTION)
    if names is None:
        return (model_id,)
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not names:
        raise ValueError(f"{SECTION}: a list of model names, at least one (got {names!r})")
    for index, name in enumerate(names):
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ValueError(f"{SECTION}[{index}]: a model name is a non-empty string without surrounding spaces (got {name!r})")
        if name in names[:index]:
            raise ValueError(f"{SECTION}[{index}]: {name!r} is listed twice")
    return tuple(names)


def check_profile(profile: dict[str, Any]) -> None:
    """The profile loader (session_server/profile.py): the list's shape, before anything loads."""
    served_names(profile, str(profile.get("model_id") or ""))


def not_served_message(requested: str, names: tuple[str, ...]) -> str:
    aliases = f" (also answering to {', '.join(repr(n) for n in names[1:])})" if len(names) > 1 else ""
    return f"The model {requested!r} is not served here; this server serves {names[0]!r}{aliases}."
