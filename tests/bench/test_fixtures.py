"""The load generator's speech input: deterministic, and heard as speech by silero VAD."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import soxr

from benchmarks.fixtures import SAMPLE_RATE, SENTENCES, make_utterance, pcm16, synthetic_speech
from nodes.vad import CONTEXT, STATE_SHAPE, WINDOW, SileroModel


def speech_probabilities(samples_24k: np.ndarray) -> np.ndarray:
    """silero VAD (the vad node's model) over 24 kHz audio, one probability per 32 ms window."""
    audio = soxr.resample(samples_24k, SAMPLE_RATE, 16000).astype(np.float32)
    model, state = SileroModel(), np.zeros(STATE_SHAPE, np.float32)
    context = np.zeros(CONTEXT, np.float32)
    probabilities = []
    for start in range(0, len(audio) - WINDOW + 1, WINDOW):
        window = audio[start : start + WINDOW]
        probability, state = model.run_batch([(np.concatenate([context, window]), state)])[0]
        context = window[-CONTEXT:]
        probabilities.append(probability)
    return np.array(probabilities)


def test_synthetic_speech_is_the_same_every_time_and_differs_between_sentences():
    assert np.array_equal(synthetic_speech(SENTENCES[0]), synthetic_speech(SENTENCES[0]))
    assert not np.array_equal(synthetic_speech(SENTENCES[0])[:24000], synthetic_speech(SENTENCES[1])[:24000])


@pytest.mark.parametrize("text", SENTENCES[:3])
def test_silero_vad_hears_the_synthetic_voice_as_speech_and_the_pause_as_silence(text):
    speech = synthetic_speech(text)
    pause = np.zeros(SAMPLE_RATE, np.float32)
    probabilities = speech_probabilities(np.concatenate([pause, speech, pause]))
    windows_per_s = 16000 / WINDOW
    spoken = probabilities[int(windows_per_s * 1.1) : int(windows_per_s * (1 + len(speech) / SAMPLE_RATE))]
    silent = probabilities[: int(windows_per_s * 0.9)]
    assert (spoken > 0.5).mean() > 0.8
    assert (silent > 0.5).mean() == 0


def test_fixtures_come_from_espeak_ng_when_installed_and_are_trimmed_to_the_speech():
    utterance = make_utterance(SENTENCES[0])
    assert utterance.source == ("espeak-ng" if shutil.which("espeak-ng") else "synthetic")
    assert 1.0 < utterance.seconds < 4.0
    edge = int(0.03 * SAMPLE_RATE)
    assert np.abs(utterance.samples[-edge:]).max() > 0.01  # no trailing silence: the speech ends where the audio ends
    assert make_utterance(SENTENCES[0], prefer="synthetic").source == "synthetic"


def test_pcm16_is_little_endian_and_clipped():
    assert pcm16(np.array([0.0, 1.0, -1.0, 2.0], np.float32)) == b"\x00\x00\xff\x7f\x01\x80\xff\x7f"
