"""Wire audio formats of the realtime protocol, decoded to and encoded from float32 mono.

Formats (GA names; beta aliases in `parse_format`):

| format                          | rate  | bytes/sample |
|---------------------------------|-------|--------------|
| `audio/pcm` (PCM16 LE)          | 24000 (default) or 16000 (sglang-omni clients) | 2 |
| `audio/pcmu` (G.711 mu-law)     | 8000  | 1 |
| `audio/pcma` (G.711 A-law)      | 8000  | 1 |

Input is decoded at its own rate; the graph's VAD resamples it to 16 kHz. Output audio leaves
the graph at 24 kHz and is resampled by a streaming resampler (its filter state kept across
chunks, so chunk seams are inaudible) when the session asks for another rate: to 8 kHz G.711
the phone line's (graph/fir_resampling.py `streaming`: 1.9 ms of lookahead, so a reply's first
chunk is out at once, and the same 24 kHz -> 8 kHz on a WebSocket as on a phone call), to
16 kHz PCM soxr's.

G.711 uses the ITU-T tables, computed once with numpy (256 entries to decode, 65536 to encode).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import soxr

from graph.fir_resampling import CentredFir, streaming

PCM = "audio/pcm"
PCMU = "audio/pcmu"
PCMA = "audio/pcma"
PCM_RATES = (24000, 16000)
OUTPUT_RATE = 24000

# Beta (pre-GA) names clients still send as `input_audio_format` / `output_audio_format`.
BETA_ALIASES = {"pcm16": (PCM, 24000), "g711_ulaw": (PCMU, 8000), "g711_alaw": (PCMA, 8000)}


class UnsupportedFormat(ValueError):
    pass


@dataclass(frozen=True)
class AudioFormat:
    type: str = PCM
    rate: int = 24000

    def to_wire(self) -> dict:
        return {"type": self.type, "rate": self.rate} if self.type == PCM else {"type": self.type}


def parse_format(value: dict | str) -> AudioFormat:
    """A GA format object ({"type": "audio/pcm", "rate": 24000}) or a beta name ("pcm16")."""
    if isinstance(value, str):
        if value in BETA_ALIASES:
            return AudioFormat(*BETA_ALIASES[value])
        raise UnsupportedFormat(f"Unsupported audio format {value!r}; use audio/pcm, audio/pcmu or audio/pcma.")
    channels = value.get("channels")
    if channels not in (None, 1):
        # Not an OpenAI field, but a client that sends it means it: interleaved stereo read as
        # mono would play at half speed.
        raise UnsupportedFormat(f"Audio is mono only: got channels {channels!r}; mix the audio down to one channel and omit `channels` (or send 1).")
    kind = value.get("type") or PCM
    rate = value.get("rate")
    if kind == PCM:
        rate = 24000 if rate is None else rate
        if rate not in PCM_RATES:
            raise UnsupportedFormat(f"Unsupported audio/pcm rate {rate!r}; supported rates are 24000 and 16000.")
        return AudioFormat(PCM, int(rate))
    if kind in (PCMU, PCMA):
        if rate not in (None, 8000):
            raise UnsupportedFormat(f"{kind} is 8000 Hz only, got rate {rate!r}.")
        return AudioFormat(kind, 8000)
    raise UnsupportedFormat(f"Unsupported audio format {kind!r}; use audio/pcm, audio/pcmu or audio/pcma.")


# --------------------------------------------------------------------------- G.711 tables


def _ulaw_decode_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    sign = u & 0x80
    exponent = (u >> 4) & 0x07
    mantissa = u & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(sign != 0, -magnitude, magnitude).astype(np.int16)


def _alaw_decode_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    sign = a & 0x80
    exponent = (a >> 4) & 0x07
    mantissa = a & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(sign != 0, magnitude, -magnitude).astype(np.int16)


def _ulaw_encode_table() -> np.ndarray:
    # Sun/CCITT reference encoder (what audioop and most telephony stacks use).
    sample = np.arange(-32768, 32768, dtype=np.int32) >> 2  # 14-bit
    mask = np.where(sample < 0, 0x7F, 0xFF)
    magnitude = np.minimum(np.abs(sample), 8159) + (0x84 >> 2)
    segment = np.maximum(np.floor(np.log2(magnitude)).astype(np.int32) - 5, 0)
    value = np.where(segment >= 8, 0x7F, (segment << 4) | ((magnitude >> np.minimum(segment + 1, 8)) & 0x0F))
    return ((value ^ mask) & 0xFF).astype(np.uint8)


def _alaw_encode_table() -> np.ndarray:
    sample = np.arange(-32768, 32768, dtype=np.int32)
    sign = np.where(sample >= 0, 0x80, 0)
    magnitude = np.where(sample >= 0, sample, -sample - 1) >> 3  # 13-bit magnitude
    exponent = np.where(magnitude >= 32, np.clip(np.floor(np.log2(np.maximum(magnitude, 1))).astype(np.int32) - 4, 1, 7), 0)
    mantissa = np.where(exponent == 0, magnitude >> 1, magnitude >> exponent) & 0x0F
    return ((sign | (exponent << 4) | mantissa) ^ 0x55).astype(np.uint8)


ULAW_DECODE = _ulaw_decode_table()
ALAW_DECODE = _alaw_decode_table()
ULAW_ENCODE = _ulaw_encode_table()  # index: int16 sample + 32768
ALAW_ENCODE = _alaw_encode_table()


# --------------------------------------------------------------------------- decode / encode


class InvalidAudio(ValueError):
    """Appended bytes the server would otherwise misread (error code `invalid_audio`)."""


class OddByteCount(InvalidAudio):
    pass


class WavHeaderMismatch(InvalidAudio):
    pass


def decode(data: bytes, fmt: AudioFormat) -> np.ndarray:
    """Wire bytes -> float32 mono in [-1, 1] at `fmt.rate`."""
    _reject_mismatched_wav(data, fmt)
    if fmt.type == PCM:
        if len(data) % 2:
            raise OddByteCount(f"audio/pcm is 16-bit: {len(data)} bytes is not a whole number of samples.")
        pcm = np.frombuffer(data, dtype="<i2")
    else:
        table = ULAW_DECODE if fmt.type == PCMU else ALAW_DECODE
        pcm = table[np.frombuffer(data, dtype=np.uint8)]
    return pcm.astype(np.float32) / 32768.0


def _reject_mismatched_wav(data: bytes, fmt: AudioFormat) -> None:
    """A whole WAV file appended as if it were raw samples: refused when its own header says
    another layout (stereo, another rate, not 16-bit PCM), which would otherwise be heard as
    noise or at the wrong speed without a word. A header that matches the session passes (its
    44 bytes are 22 samples of click)."""
    if len(data) < 36 or data[:4] != b"RIFF" or data[8:12] != b"WAVE" or data[12:16] != b"fmt ":
        return
    encoding, channels, rate = struct.unpack_from("<HHI", data, 20)
    bits = struct.unpack_from("<H", data, 34)[0]
    expected = {PCM: (1, 16), PCMU: (7, 8), PCMA: (6, 8)}[fmt.type]
    if channels != 1 or rate != fmt.rate or (encoding, bits) != expected:
        raise WavHeaderMismatch(
            f"This audio is a WAV file ({channels} channel(s), {rate} Hz, {bits}-bit, encoding {encoding}) but the session's "
            f"input format is {fmt.type} mono at {fmt.rate} Hz: send raw mono samples in that format "
            "(strip the WAV header; downmix and resample first, or set session.audio.input.format)."
        )


def to_int16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype(np.int16)


def g711(samples: np.ndarray, kind: str = PCMU) -> bytes:
    """float32 mono in [-1, 1] -> G.711 bytes (mu-law for `audio/pcmu`, A-law for `audio/pcma`)."""
    table = ULAW_ENCODE if kind == PCMU else ALAW_ENCODE
    return table[to_int16(samples).astype(np.int32) + 32768].tobytes()


class OutputEncoder:
    """float32 24 kHz reply audio -> wire bytes in the session's output format.

    One encoder per response: the resampler's filter state carries across that reply's chunks.
    """

    def __init__(self, fmt: AudioFormat, source_rate: int = OUTPUT_RATE):
        self.format = fmt
        self.source_rate = source_rate
        self._resampler: CentredFir | soxr.ResampleStream | None = None
        if fmt.rate != source_rate:
            self._resampler = (streaming(source_rate, fmt.rate)
                               or soxr.ResampleStream(source_rate, fmt.rate, 1, dtype="float32", quality="HQ"))
        self.samples_in = 0  # at source_rate: how much reply audio this encoder has been given

    def encode(self, samples: np.ndarray, sample_rate: int = OUTPUT_RATE) -> bytes:
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if sample_rate != self.source_rate:
            samples = soxr.resample(samples, sample_rate, self.source_rate, quality="HQ")
        self.samples_in += len(samples)
        if self._resampler is not None:
            samples = self._resampler.resample_chunk(samples)
        return self._wire(samples)

    def flush(self) -> bytes:
        """The resampler's tail (its filter delay) at the end of a reply."""
        if self._resampler is None:
            return b""
        return self._wire(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True))

    def _wire(self, samples: np.ndarray) -> bytes:
        if self.format.type == PCM:
            return to_int16(samples).astype("<i2").tobytes()
        return g711(samples, self.format.type)

    @property
    def duration_ms(self) -> float:
        return self.samples_in * 1000.0 / self.source_rate
