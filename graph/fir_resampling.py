"""Streaming resamplers for the phone rate that look 2 ms ahead, not soxr's 20-100 ms.

    Downsample3: 24 kHz -> 8 kHz (reply audio onto a phone line)
    Upsample2:    8 kHz -> 16 kHz (a phone caller's audio into the VAD and the model)

Why: soxr's streaming resampler (HQ) lets its output out in blocks. Fed 20 ms at a time, from
8 kHz to 16 kHz it held back 20-100 ms (66 ms on average), so the VAD heard the end of a
phone caller's speech that much later than a WebSocket client's at 24 kHz (21 ms); from
24 kHz to 8 kHz a reply's first 57 ms chunk gave no sample at all, so its first packet waited
for the second chunk. Here each output sample is the input through a centred linear-phase FIR
(a Kaiser-windowed sinc), and it is out as soon as the input `half` taps past its centre is in.

The output is in step with the input and exactly as long as it times the ratio: a stream's
first output sample is its first input sample's instant (no leading delay), and what is not
out yet is only the last lookahead, which `resample_chunk(..., last=True)` lets out (the audio
after it taken as silence). `resample_chunk` has soxr.ResampleStream's signature, so either
serves where the other did; for other rates soxr stays.
"""

from __future__ import annotations

import numpy as np


def lowpass(cutoff: float, half: int, attenuation_db: float, gain: float = 1.0) -> np.ndarray:
    """A linear-phase low-pass FIR of 2 * half + 1 taps (cutoff in cycles per sample), `gain` at DC."""
    n = np.arange(-half, half + 1)
    taps = 2 * cutoff * np.sinc(2 * cutoff * n) * np.kaiser(n.size, 0.1102 * (attenuation_db - 8.7))
    return (taps * gain / taps.sum()).astype(np.float32)


class CentredFir:
    """Up by `up` (zeros between samples), through `taps` (2 * half + 1, at the raised rate),
    down by `down` (every `down`th sample), streaming."""

    def __init__(self, taps: np.ndarray, up: int, down: int):
        self.taps, self.up, self.down = taps, up, down
        self.half = (taps.size - 1) // 2
        self._pending = np.zeros(self.half, np.float32)  # the raised input, from `half` before the next centre
        self._centre = self.half  # the next output's centre in `_pending`

    def resample_chunk(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        samples = np.asarray(samples, np.float32).reshape(-1)
        if self.up > 1:
            raised = np.zeros(samples.size * self.up, np.float32)
            raised[::self.up] = samples
            samples = raised
        pending = np.concatenate([self._pending, samples])
        end = pending.size  # the input ends here; after `last`, silence
        if last:
            pending = np.concatenate([pending, np.zeros(self.half, np.float32)])
        reach = min(pending.size - self.half, end) - self._centre  # centres with their lookahead in
        count = max(0, -(-reach // self.down))
        if count:
            span = pending[self._centre - self.half:self._centre + (count - 1) * self.down + self.half + 1]
            out = np.convolve(span, self.taps, mode="valid")[::self.down].astype(np.float32)
        else:
            out = np.zeros(0, np.float32)
        self._centre += count * self.down
        self._pending, self._centre = pending[self._centre - self.half:end], self.half
        return out


class Downsample3(CentredFir):
    """24 kHz -> 8 kHz: 91 taps, cutoff 3.9 kHz (flat to 3.3 kHz, -74 dB from 4.5 kHz, so
    nothing above the phone band folds into it), 45 taps (1.9 ms) of lookahead."""

    TAPS = lowpass(cutoff=3900 / 24000, half=45, attenuation_db=70)

    def __init__(self) -> None:
        super().__init__(self.TAPS, up=1, down=3)


class Upsample2(CentredFir):
    """8 kHz -> 16 kHz: 73 taps at 16 kHz, cutoff 3.8 kHz (flat to 3.4 kHz, the images of the
    phone band 75 dB down or more), 36 taps (2.25 ms) of lookahead."""

    TAPS = lowpass(cutoff=3800 / 16000, half=36, attenuation_db=70, gain=2.0)

    def __init__(self) -> None:
        super().__init__(self.TAPS, up=2, down=1)


# The rate pairs the phone path resamples on every call, each with its short-lookahead filter.
_STREAMING = {(24000, 8000): Downsample3, (8000, 16000): Upsample2}


def streaming(from_rate: int, to_rate: int) -> CentredFir | None:
    """A fresh short-lookahead resampler for this rate pair, or None where there is none (the
    caller falls back to soxr, which graph does not import)."""
    kind = _STREAMING.get((from_rate, to_rate))
    return None if kind is None else kind()
