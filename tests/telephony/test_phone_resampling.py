"""The phone rate's resamplers (graph/fir_resampling.py): the phone band kept, what would fold
or mirror into it dropped, output in step with the input and out 2 ms after it."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from graph.fir_resampling import Downsample3, Upsample2
from tests.webrtc.helpers import dominant_hz, rms


def tone(seconds: float, hz: float, rate: int, amplitude: float = 0.5) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * hz * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def streamed(stream, source: np.ndarray, chunk: int) -> np.ndarray:
    parts = [stream.resample_chunk(source[i:i + chunk]) for i in range(0, source.size, chunk)]
    return np.concatenate([*parts, stream.resample_chunk(np.zeros(0, np.float32), last=True)])


@pytest.mark.parametrize("make, rate_in, rate_out, kept_hz, dropped_hz", [
    (Downsample3, 24000, 8000, 1000.0, 6000.0),  # 6 kHz would fold to 2 kHz
    (Upsample2, 8000, 16000, 3000.0, None),
])
def test_the_phone_band_passes_unchanged_in_20_ms_chunks(make, rate_in, rate_out, kept_hz, dropped_hz):
    out = streamed(make(), tone(0.5, kept_hz, rate_in), rate_in // 50)
    assert out.size == rate_out // 2  # 0.5 s, tail included: as long as the input
    assert abs(rms(out[200:-200]) - 0.5 / np.sqrt(2)) < 0.005
    assert abs(dominant_hz(out, rate_out) - kept_hz) <= 10
    if dropped_hz is not None:
        assert rms(streamed(make(), tone(0.5, dropped_hz, rate_in), rate_in // 50)[200:-200]) < 0.5 * 10 ** (-60 / 20)


def test_upsampling_puts_nothing_above_the_phone_band():
    out = streamed(Upsample2(), tone(0.5, 3300.0, 8000), 160)
    spectrum = np.abs(np.fft.rfft(out[400:-400] * np.hanning(out.size - 800)))
    hz = np.fft.rfftfreq(out.size - 800, 1 / 16000)
    assert spectrum[hz > 4400].max() < spectrum.max() * 10 ** (-60 / 20)  # the 4.7 kHz image: 60 dB down or more


@pytest.mark.parametrize("make, rate_in", [(Downsample3, 24000), (Upsample2, 8000)])
def test_chunked_equals_one_piece_and_the_output_is_in_step_with_the_input(make, rate_in):
    source = tone(0.3, 700.0, rate_in) * np.linspace(0, 1, int(0.3 * rate_in), dtype=np.float32)
    whole = make().resample_chunk(source, last=True)
    stream = make()
    cuts = [0, 1, 2, 100, 101, 1371, 1500, source.size]
    chunked = np.concatenate([*(stream.resample_chunk(source[a:b]) for a, b in zip(cuts, cuts[1:])),
                              stream.resample_chunk(np.zeros(0, np.float32), last=True)])
    np.testing.assert_allclose(chunked, whole, atol=1e-6)
    reference = soxr.resample(source, rate_in, 16000 if make is Upsample2 else 8000, quality="VHQ")
    lag = np.argmax(np.correlate(whole, reference, "full")) - (reference.size - 1)
    assert lag == 0  # no leading delay: the first output sample is the first input sample's instant


@pytest.mark.parametrize("make, rate_in, most_ms", [(Downsample3, 24000, 2.0), (Upsample2, 8000, 2.5)])
def test_what_is_held_back_of_20_ms_chunks_is_the_lookahead_only(make, rate_in, most_ms):
    stream, rate_out = make(), 8000 if make is Downsample3 else 16000
    sent = out = 0
    for _ in range(50):
        out += stream.resample_chunk(np.random.default_rng(0).standard_normal(rate_in // 50).astype(np.float32) * 0.1).size
        sent += rate_in // 50
        assert (sent * rate_out / rate_in - out) * 1000 / rate_out <= most_ms
