"""The voice registry on S3-compatible storage: `--voices-url s3://BUCKET/PREFIX` (profile
`speech.voices_url`), shared by every replica.

The same objects as the local registry's files (`voice_registry.py`): one `.safetensors` per voice
under PREFIX, named after a hash of the voice name, its metadata in the safetensors header. boto3
reads the standard AWS environment (`AWS_ENDPOINT_URL` for a non-AWS server such as MinIO,
`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`).

Uploads stay atomic: an object is written by one PUT, which S3 makes visible whole or not at all,
so a crash mid-upload leaves the previous version. A voice uploaded through one replica is seen
by every other at its next list or lookup: each lists the prefix (one request) and reads the
headers again when the listing changed (an ETag, a size or a key differs).
"""

from __future__ import annotations

import json
import logging
import struct
from typing import Any
from urllib.parse import urlparse

import msgspec
import numpy as np
from safetensors.numpy import load as load_tensors
from safetensors.numpy import save as save_tensors

from session_server.speech.voice_registry import Voice, VoiceRegistry, _file_name, _metadata

log = logging.getLogger(__name__)


def parse_voices_url(url: str) -> tuple[str, str]:
    """(bucket, prefix ending in '/' or empty) of `s3://BUCKET/PREFIX`; ValueError otherwise."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"speech.voices_url: {url!r} is not an S3 URL (s3://BUCKET/PREFIX)")
    prefix = parsed.path.lstrip("/")
    return parsed.netloc, (prefix.rstrip("/") + "/") if prefix else ""


class S3VoiceRegistry(VoiceRegistry):
    def __init__(self, url: str, *, client: Any = None, **options: Any):
        super().__init__(".", **options)
        self.url = url
        self.bucket, self.prefix = parse_voices_url(url)
        if client is None:
            import boto3

            client = boto3.client("s3")
        self._s3 = client

    def load(self) -> None:
        with self._lock:
            self._scan()
        log.info("restored %d uploaded voice(s) from %s", len(self._voices), self.url)

    def _listing(self) -> dict[str, tuple[str, int]]:
        objects: dict[str, tuple[str, int]] = {}
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
            for entry in page.get("Contents", ()):
                key = entry["Key"]
                if key.endswith(".safetensors") and "/" not in key[len(self.prefix):]:
                    objects[key] = (entry.get("ETag", ""), int(entry.get("Size", 0)))
        return objects

    def _signature(self) -> frozenset[tuple[str, int, int, int]] | None:
        try:
            return frozenset((key, hash(etag), size, 0) for key, (etag, size) in self._listing().items())
        except Exception as exc:  # noqa: BLE001 - storage unreachable: keep what is known
            log.warning("cannot list voices at %s: %s", self.url, exc)
            return self._seen

    def _scan(self, remove_leftovers: bool = False) -> None:
        listing = self._listing()
        self._seen = frozenset((key, hash(etag), size, 0) for key, (etag, size) in listing.items())
        restored: dict[str, Voice] = {}
        builtin = {b.lower() for b in self.builtin}
        for key in sorted(listing):
            try:
                voice = self._read_header(key)
            except Exception as exc:  # noqa: BLE001 - one bad object must not stop the server
                log.warning("skipping unreadable voice object %s: %s", key, exc)
                continue
            if key != self._key(voice.name) or voice.name.lower() in builtin:
                log.warning("skipping voice object %s (name mismatch or a built-in voice)", key)
                continue
            restored[voice.name] = voice
        self._voices = restored

    def _read_header(self, key: str) -> Voice:
        head = self._s3.get_object(Bucket=self.bucket, Key=key, Range="bytes=0-7")["Body"].read()
        (length,) = struct.unpack("<Q", head)
        if length > 1024 * 1024:
            raise ValueError("header too large")
        header = self._s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes=8-{7 + length}")["Body"].read()
        metadata = json.loads(header).get("__metadata__") or {}
        if metadata.get("format") != "sgl-omni-voice":
            raise ValueError("not a voice file")
        return msgspec.convert(json.loads(metadata["voice"]), Voice)

    def _key(self, name: str) -> str:
        return self.prefix + _file_name(name)

    def _ensure_storage(self) -> None:
        pass  # the bucket exists (creating buckets is the operator's business)

    def _write_atomically(self, voice: Voice, samples: np.ndarray) -> None:
        body = save_tensors({"audio": samples}, metadata=_metadata(voice))
        self._s3.put_object(Bucket=self.bucket, Key=self._key(voice.name), Body=body)

    def _remove(self, name: str) -> None:
        self._s3.delete_object(Bucket=self.bucket, Key=self._key(name))

    def _read_audio(self, name: str) -> np.ndarray:
        body = self._s3.get_object(Bucket=self.bucket, Key=self._key(name))["Body"].read()
        return load_tensors(body)["audio"]
