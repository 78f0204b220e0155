"""Uploaded voices: a model-independent registry persisted as one `.safetensors` file per voice.

Each file holds the decoded reference audio (`audio`: float32 mono at the upload's own rate)
and, in the safetensors header's string metadata, everything else: name, consent, created_at,
mime_type, file_size, sample_rate, the matched built-in `speaker` and the optional ref_text /
speaker_description. Files are
named after a hash of the voice name (`voice-<sha256[:32]>.safetensors`), so any valid name maps
to a safe, fixed-length file name; the name itself is read back from the header.

On start the directory is scanned and every readable voice is restored; unreadable files and
files whose name collides with a built-in speaker are skipped with a warning, so an upload can
never shadow a model speaker. The directory may be shared by several replicas: when its voice
files change (another replica added, replaced or deleted one) the headers are read again.
`voice_registry_s3.py` keeps the same files in an S3 bucket instead (`--voices-url s3://...`).

Replacing a voice writes the new file under a temporary name, fsyncs it, then `os.replace`s it
over the old one: a failed re-upload (bad audio, full disk, crash mid-write) leaves the existing
voice intact. Leftover temporary files are removed at start.

Limits (each is what a client sees when hit):
- `max_voices` (default 1000): an upload of a new name past it gets 400 `voice_limit_reached`.
- audio length `min_seconds`..`max_seconds` (1 s..60 s): 400 `invalid_audio`. A 60 s clip at
  48 kHz costs 11.5 MB on disk as float32; uploads are also capped at 10 MiB before decoding.
- policy `overwrite` (default): re-uploading a name replaces it; `immutable`: 409 `voice_exists`
  until the voice is deleted.

This module does no model work. Qwen3-Omni cannot clone voices: the upload route matches each
sample to the nearest built-in speaker (`voice_match.py`) and stores that speaker's name with the
voice (`Voice.speaker`), so every replica sharing the registry speaks it with the same speaker.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

log = logging.getLogger(__name__)

POLICIES = ("overwrite", "immutable")
MAX_NAME_LENGTH = 128
_FORMAT_VERSION = "1"
_TMP_PREFIX = ".tmp-"


class VoiceError(Exception):
    """A rejected voice operation, with the HTTP status and a code clients can branch on."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param


class Voice(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the registry knows about one uploaded voice (the wire shape of `uploaded_voices`)."""

    name: str
    consent: str
    created_at: int
    file_size: int
    mime_type: str
    sample_rate: int
    duration_s: float
    ref_text: str | None = None
    speaker_description: str | None = None
    # The loaded model's built-in speaker the voice speaks with (voice_match.py); None for a voice
    # stored by a version without matching: it is refused until uploaded again.
    speaker: str | None = None

    def public(self) -> dict[str, Any]:
        """The entry as listed by `GET /v1/audio/voices` (optional fields omitted when unset)."""
        entry = msgspec.to_builtins(self)
        entry.pop("sample_rate", None)
        entry.pop("duration_s", None)
        return entry


def validate_voice_name(name: str, builtin: set[str] | frozenset[str]) -> str:
    """The name as stored; raises VoiceError(400) for names a file system or the model forbids."""
    if not isinstance(name, str) or not name.strip():
        raise VoiceError(400, "invalid_voice_name", "Voice name cannot be empty", "name")
    if name != name.strip():
        raise VoiceError(400, "invalid_voice_name", "Voice name cannot start or end with whitespace", "name")
    if len(name) > MAX_NAME_LENGTH:
        raise VoiceError(400, "invalid_voice_name", f"Voice name is longer than {MAX_NAME_LENGTH} characters", "name")
    if "\x00" in name or "/" in name or "\\" in name:
        raise VoiceError(400, "invalid_voice_name", "Voice name cannot contain path separators or NUL", "name")
    if name in (".", "..") or any(ord(ch) < 32 for ch in name):
        raise VoiceError(400, "invalid_voice_name", f"Voice name {name!r} is not allowed", "name")
    if name.lower() in {b.lower() for b in builtin}:
        raise VoiceError(400, "invalid_voice_name", f"Voice name {name!r} is a built-in voice of the loaded model", "name")
    return name


class VoiceRegistry:
    """Uploaded voices on disk, with their metadata in memory (audio is read on demand)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        builtin: set[str] | frozenset[str] = frozenset(),
        max_voices: int = 1000,
        policy: str = "overwrite",
        min_seconds: float = 1.0,
        max_seconds: float = 60.0,
    ):
        if policy not in POLICIES:
            raise ValueError(f"voice overwrite policy must be one of {POLICIES}; got {policy!r}")
        self.directory = Path(directory).expanduser()
        self.builtin = frozenset(builtin)
        self.max_voices = max_voices
        self.policy = policy
        self.min_seconds = min_seconds
        self.max_seconds = max_seconds
        self._voices: dict[str, Voice] = {}
        self._seen: frozenset[tuple[str, int, int, int]] | None = None
        # Uploads and deletes run in worker threads; one lock keeps the map and the files in step.
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ startup

    def load(self) -> None:
        """Restore every readable voice from the directory (creating it if needed)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._scan(remove_leftovers=True)
        log.info("restored %d uploaded voice(s) from %s", len(self._voices), self.directory)

    def _scan(self, remove_leftovers: bool = False) -> None:
        """Read every voice file's header. Call with the lock held."""
        self._seen = self._signature()
        restored: dict[str, Voice] = {}
        for path in sorted(self.directory.iterdir()):
            if path.name.startswith(_TMP_PREFIX):
                if remove_leftovers:
                    path.unlink(missing_ok=True)  # an upload that never finished
                continue
            if path.suffix != ".safetensors":
                continue
            try:
                voice = _read_voice(path)
            except Exception as exc:  # noqa: BLE001 - one bad file must not stop the server
                log.warning("skipping unreadable voice file %s: %s", path, exc)
                continue
            if path.name != _file_name(voice.name):
                log.warning("skipping voice file %s: its name does not match voice %r", path, voice.name)
                continue
            if voice.name.lower() in {b.lower() for b in self.builtin}:
                log.warning("ignoring uploaded voice %r: it collides with a built-in voice", voice.name)
                continue
            restored[voice.name] = voice
        self._voices = restored

    def _signature(self) -> frozenset[tuple[str, int, int, int]] | None:
        """Name, inode, size and mtime of every voice file: changes whenever a file is added,
        replaced (a new inode) or deleted, whatever the file system's timestamp granularity."""
        try:
            with os.scandir(self.directory) as entries:
                files = []
                for entry in entries:
                    if entry.name.endswith(".safetensors") and not entry.name.startswith(_TMP_PREFIX):
                        info = entry.stat()
                        files.append((entry.name, entry.inode(), info.st_size, info.st_mtime_ns))
                return frozenset(files)
        except OSError:
            return None

    def _refresh(self) -> None:
        """Pick up changes other replicas made to a shared directory. Call with the lock held.

        One `scandir` per call (a stat per voice file) notices them; only then are headers read.
        """
        if self._signature() != self._seen:
            self._scan()

    # ------------------------------------------------------------------ queries

    def list(self) -> list[Voice]:
        with self._lock:
            self._refresh()
            return sorted(self._voices.values(), key=lambda v: v.created_at)

    def get(self, name: str) -> Voice | None:
        with self._lock:
            self._refresh()
            return self._voices.get(name)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            self._refresh()
            return name in self._voices

    def audio(self, name: str) -> tuple[np.ndarray, int]:
        """The stored reference audio of `name` (float32 mono, its sample rate)."""
        voice = self.get(name)
        if voice is None:
            raise VoiceError(404, "voice_not_found", f"Voice '{name}' not found", "name")
        return self._read_audio(name), voice.sample_rate

    # ------------------------------------------------------------------ changes

    def add(
        self,
        *,
        name: str,
        consent: str,
        samples: np.ndarray,
        sample_rate: int,
        mime_type: str,
        file_size: int,
        ref_text: str | None = None,
        speaker_description: str | None = None,
        speaker: str | None = None,
    ) -> tuple[Voice, bool]:
        """Store a voice; returns it and whether it replaced an existing one. Blocking (disk)."""
        duration = self.check_upload(name=name, consent=consent, samples=samples, sample_rate=sample_rate)
        voice = Voice(
            name=name,
            consent=consent,
            created_at=int(time.time()),
            file_size=int(file_size),
            mime_type=mime_type,
            sample_rate=int(sample_rate),
            duration_s=round(duration, 3),
            ref_text=ref_text or None,
            speaker_description=speaker_description or None,
            speaker=speaker,
        )
        with self._lock:
            self._refresh()
            replaced = name in self._voices
            if replaced and self.policy == "immutable":
                raise VoiceError(
                    409, "voice_exists", f"Voice '{name}' already exists; delete it first (the server's policy is immutable)", "name"
                )
            if not replaced and len(self._voices) >= self.max_voices:
                raise VoiceError(400, "voice_limit_reached", f"The server holds at most {self.max_voices} uploaded voices", "name")
            self._ensure_storage()
            self._write_atomically(voice, np.ascontiguousarray(samples, dtype=np.float32))
            self._voices[name] = voice
            self._seen = self._signature()
        if replaced:
            log.warning("uploaded voice %r replaced an existing voice of that name", name)
        return voice, replaced

    def check_upload(self, *, name: str, consent: str, samples: np.ndarray, sample_rate: int) -> float:
        """Raises VoiceError(400) for what `add` would refuse before storing; returns the duration (s)."""
        validate_voice_name(name, self.builtin)
        if not consent or not consent.strip():
            raise VoiceError(400, "invalid_consent", "consent is required", "consent")
        duration = len(samples) / float(sample_rate) if sample_rate > 0 else 0.0
        if duration < self.min_seconds:
            raise VoiceError(
                400, "invalid_audio", f"Audio sample is too short ({duration:.2f} s; at least {self.min_seconds:g} s)", "audio_sample"
            )
        if duration > self.max_seconds:
            raise VoiceError(
                400, "invalid_audio", f"Audio sample is too long ({duration:.2f} s; at most {self.max_seconds:g} s)", "audio_sample"
            )
        return duration

    def delete(self, name: str) -> None:
        with self._lock:
            self._refresh()
            if name not in self._voices:
                raise VoiceError(404, "voice_not_found", f"Voice '{name}' not found", "name")
            self._remove(name)
            del self._voices[name]
            self._seen = self._signature()

    # ------------------------------------------------------------------ files

    def _path(self, name: str) -> Path:
        return self.directory / _file_name(name)

    # Storage primitives: a directory here; S3 in voice_registry_s3.py.
    def _ensure_storage(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)

    def _remove(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)

    def _read_audio(self, name: str) -> np.ndarray:
        with safe_open(self._path(name), framework="numpy") as handle:
            return handle.get_tensor("audio")

    def _write_atomically(self, voice: Voice, samples: np.ndarray) -> None:
        final = self._path(voice.name)
        temporary = self.directory / f"{_TMP_PREFIX}{uuid.uuid4().hex}.safetensors"
        try:
            save_file({"audio": samples}, str(temporary), metadata=_metadata(voice))
            with open(temporary, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(temporary, final)  # the swap: readers see the old file or the new one
        finally:
            temporary.unlink(missing_ok=True)
        try:  # make the rename itself durable
            directory_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(directory_fd)
            finally:
                os.close(directory_fd)
        except OSError:
            pass


def _file_name(name: str) -> str:
    return f"voice-{hashlib.sha256(name.encode('utf-8')).hexdigest()[:32]}.safetensors"


def _metadata(voice: Voice) -> dict[str, str]:
    fields = {key: value for key, value in msgspec.to_builtins(voice).items() if value is not None}
    return {"format": "sgl-omni-voice", "version": _FORMAT_VERSION, "voice": json.dumps(fields, ensure_ascii=False)}


def _read_voice(path: Path) -> Voice:
    with safe_open(str(path), framework="numpy") as handle:
        metadata = handle.metadata() or {}
        if metadata.get("format") != "sgl-omni-voice":
            raise ValueError("not a voice file")
        if "audio" not in handle.keys():
            raise ValueError("no audio tensor")
        voice = msgspec.convert(json.loads(metadata["voice"]), Voice)
    return voice
