"""Server profiles shipped with the package (YAML), found wherever the package is installed."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

DEFAULT_PROFILE = "embedded_cpu.yaml"


class ProfileError(ValueError):
    pass


def builtin_profiles() -> list[str]:
    return sorted(p.name for p in resources.files(__package__).iterdir() if p.name.endswith(".yaml"))


def load_profile(name_or_path: str | None = None) -> dict[str, Any]:
    """A path to a YAML file, or the name of a shipped profile (`.yaml` optional); None -> the embedded CPU default."""
    name_or_path = name_or_path or DEFAULT_PROFILE
    path = Path(name_or_path)
    if path.is_file():
        text = path.read_text()
    else:
        shipped = resources.files(__package__) / name_or_path
        if not shipped.is_file() and not name_or_path.endswith((".yaml", ".yml")):
            shipped = resources.files(__package__) / f"{name_or_path}.yaml"  # `--config embedded_cpu`
        if not shipped.is_file():
            raise ProfileError(f"--config {name_or_path}: no such file, and no shipped profile of that name (shipped: {', '.join(builtin_profiles())})")
        text = shipped.read_text()
    try:
        profile = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"--config {name_or_path}: not valid YAML: {exc}") from None
    if not isinstance(profile, dict):
        raise ProfileError(f"--config {name_or_path}: the profile must be a YAML mapping")
    return profile


def override_model_path(profile: dict[str, Any], model_path: str) -> int:
    """Point every resource that loads a checkpoint (`params.path`) at `model_path`. Returns how many."""
    count = 0
    for resource in (profile.get("resources") or {}).values():
        params = resource.setdefault("params", {}) if isinstance(resource, dict) else None
        if params is not None and "path" in params:
            params["path"] = model_path
            count += 1
    return count


def serves_embedded_checkpoint(profile: dict[str, Any]) -> bool:
    """True when a resource loads the embedded tiny random-weight checkpoint (`path: null`)."""
    return any(
        isinstance(resource, dict) and isinstance(resource.get("params"), dict)
        and "path" in resource["params"] and resource["params"]["path"] is None
        and not resource["params"].get("random_weights")
        for resource in (profile.get("resources") or {}).values()
    )
