"""OpenAPI request bodies for routes that read the raw `Request`.

Such routes validate their bodies themselves, at the edge, with coded errors; FastAPI cannot see
what they accept, so each declares it here (`openapi_extra`) and /openapi.json stays honest: a
client generator, or schemathesis (tests/server/test_openapi_fuzz.py), gets the real shapes.
"""

from __future__ import annotations

from typing import Any


def declared_body(content: dict[str, dict[str, Any]], required: bool = True) -> dict[str, Any]:
    """`openapi_extra` for a route: media type -> the JSON schema of a body of that type."""
    return {"requestBody": {"required": required, "content": {media: {"schema": schema} for media, schema in content.items()}}}
