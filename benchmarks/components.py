"""The `components` scenario: the server's model work called directly, without the server.

Every figure the server scenarios report has its limit here: the same model code, one session,
no transport, no graph, no queues, no other sessions. The gap between the two is what the
server adds (and, with batching, what concurrency buys back):

- `vad`: silero VAD (the vad node's `SileroModel`, the same ONNX file) over a minute of speech
  and silence in 32 ms windows, one window per call, then 16 sessions per call (one batched step).
- `end_of_turn`: the Smart Turn v3.2 classifier (`semantic_vad`, nodes/smart_turn.py; needs the
  `smart-turn` extra) beside it: ms per call, one turn per call and 16 per call, and per
  session-second of the same audio: the checks the VAD node would make at its pauses (200 ms,
  then each time the pause doubles, up to 4 s; the upper bound, as if no turn ended at a check).
- `reply`: one spoken turn through the engines the nodes run (`ThinkerSession`, `TalkerReply`,
  `Code2WavStream`, interleaved as the streaming graph interleaves them): audio features,
  audio encoder, thinker prefill, thinker decode, talker frames, code2wav chunks. Its
  `first_audio_ms` is the direct first-audio compute: from the end of the user's turn to the
  first decoded audio chunk. Thinker, talker and code2wav figures are split out of the same run.
- `speech`: text-to-speech as /v1/audio/speech runs it (the text is the reply: talker + code2wav).
- what a step costs the host (benchmarks/step_costs.py, the figures that bound a GPU engine):
  `thinker.ops_per_step_16` and `thinker.host_syncs_per_step`, the aten operators and host
  syncs of one decode step of 16 sessions; `talker.ops_per_frame` and `talker.ms_per_frame`,
  one talker frame (its code predictor's included) of one reply, `step_replies` alone. The
  talker's frames inside the spoken turn are `talker.reply_ms_per_frame` / `reply_frames_per_s`.
  `code2wav.chunk_ms` / `chunk_ops` and `chunk_ms_captured` / `chunk_ops_captured`: one
  steady streaming chunk (6 frames) of one reply, eager and captured (`compute: {graphs: auto}`,
  captured_code2wav.py), alternating in one run (the spoken turn's chunks run eager).

`nodes` (and torch) are imported only inside this module's functions: `benchmarks` sits beside
the server's layers, and the other scenarios never load a model in the harness process.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks.fixtures import QUICK_SENTENCE, SENTENCES, make_utterance


# Each direct measurement runs this many times and the best run is reported: on a shared
# machine the best run is the one least disturbed by other processes, the closest to the limit.
REPEATS = 3
# Sessions for the `batching` figures (the 16-session point).
BATCHED_SESSIONS = 16


def run(config: str | None, quick: bool = False, seed: int = 0, deadline: float | None = None, max_output_tokens: int = 16) -> dict[str, Any]:
    results: dict[str, Any] = {}
    results["vad"] = _guarded(vad_figures, 10.0 if quick else 60.0, 4 if quick else 16)
    results["end_of_turn"] = _guarded(end_of_turn_figures, 10.0 if quick else 60.0, 4 if quick else 16, 1 if quick else REPEATS)
    try:
        omni = load_model(config)
    except Exception as exc:  # noqa: BLE001 - reported as the reason the model figures are missing
        reason = f"{type(exc).__name__}: {exc}"[:300]
        for name in ("reply", "thinker", "talker", "code2wav", "speech"):
            results[name] = {"skipped": reason}
        return results
    import torch

    torch.manual_seed(seed)
    texts = [QUICK_SENTENCE] if quick else list(SENTENCES[:2])
    # Warm-up (discarded): first calls pay one-off allocations and kernel selection.
    _guarded(reply_figures, omni, make_utterance(QUICK_SENTENCE), 2)
    _guarded(speech_figures, omni, [QUICK_SENTENCE[:12]])
    repeats = 1 if quick else REPEATS
    runs = [_guarded(reply_figures, omni, make_utterance(text), max_output_tokens) for text in texts for _ in range(repeats)]
    good = [r for r in runs if "skipped" not in r]
    if not good:
        for name in ("reply", "thinker", "talker", "code2wav"):
            results[name] = runs[0]
    else:
        best = min(good, key=lambda r: r["reply"]["first_audio_ms"])
        results.update(best)
    costs = _guarded(step_cost_figures, omni, quick)
    for name in ("thinker", "talker", "code2wav"):
        section = results[name] = dict(results.get(name) or {})
        if "skipped" in costs:
            section["step_costs_skipped"] = costs["skipped"]
        else:
            section.update(costs[name])
    if deadline is None or time.monotonic() < deadline:
        speech_runs = [_guarded(speech_figures, omni, texts) for _ in range(repeats)]
        results["speech"] = max(speech_runs, key=lambda r: r.get("audio_s_per_s", -1.0))
    else:
        results["speech"] = {"skipped": "deadline reached"}
    if deadline is None or time.monotonic() < deadline:
        results["batching"] = _guarded(batching_figures, omni, 4 if quick else BATCHED_SESSIONS, repeats)
    else:
        results["batching"] = {"skipped": "deadline reached"}
    return results


def _guarded(fn, *args: Any) -> dict[str, Any]:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - one component failing must not hide the others
        return {"skipped": f"{type(exc).__name__}: {exc}"[:300]}


def load_model(config: str | None) -> Any:
    """The profile's `qwen3_omni.model` resource, loaded as the server loads it."""
    from configs import load_profile

    profile = load_profile(config)
    for resource in (profile.get("resources") or {}).values():
        if isinstance(resource, dict) and resource.get("type") == "qwen3_omni.model":
            from nodes.qwen3_omni.model import load_omni_model

            return load_omni_model(dict(resource.get("params") or {}))
    raise LookupError("the profile has no qwen3_omni.model resource")


# --------------------------------------------------------------------------- vad


def _speech_with_pauses(seconds: float) -> np.ndarray:
    """16 kHz: the fixture sentences with 0.8 s pauses between them."""
    import soxr

    pieces, total = [], 0.0
    index = 0
    while total < seconds:
        utterance = make_utterance(SENTENCES[index % len(SENTENCES)])
        pieces += [utterance.samples, np.zeros(int(0.8 * 24000), np.float32)]
        total += utterance.seconds + 0.8
        index += 1
    return soxr.resample(np.concatenate(pieces), 24000, 16000).astype(np.float32)[: int(seconds * 16000)]


def vad_figures(seconds: float, sessions: int) -> dict[str, Any]:
    from nodes.vad import CONTEXT, STATE_SHAPE, WINDOW, SileroModel

    audio = _speech_with_pauses(seconds)
    windows = [np.concatenate([audio[max(0, i - CONTEXT) : i] if i else np.zeros(CONTEXT, np.float32), audio[i : i + WINDOW]]) for i in range(0, len(audio) - WINDOW + 1, WINDOW)]
    windows = [np.pad(w, (CONTEXT + WINDOW - len(w), 0)) for w in windows]
    model = SileroModel()
    state = np.zeros(STATE_SHAPE, np.float32)
    model.run_batch([(windows[0], state)])  # warm-up
    started = time.perf_counter()
    speech_windows = 0
    for window in windows:
        probability, state = model.run_batch([(window, state)])[0]
        speech_windows += probability > 0.5
    one = time.perf_counter() - started
    states = [np.zeros(STATE_SHAPE, np.float32) for _ in range(sessions)]
    started = time.perf_counter()
    for window in windows:
        out = model.run_batch([(window, s) for s in states])
        states = [s for _, s in out]
    batched = time.perf_counter() - started
    audio_s = len(windows) * WINDOW / 16000
    return {
        "audio_s": round(audio_s, 1),
        "windows": len(windows),
        "speech_share": round(speech_windows / len(windows), 2),
        "compute_s": round(one, 3),
        "ms_per_window": round(one / len(windows) * 1000, 3),
        "x_realtime": round(audio_s / one, 1),
        "batched_sessions": sessions,
        "batched_x_realtime": round(audio_s * sessions / batched, 1),
    }


def end_of_turn_figures(seconds: float, sessions: int, repeats: int) -> dict[str, Any]:
    from nodes.smart_turn import SmartTurnModel
    from nodes.vad import CONTEXT, STATE_SHAPE, WINDOW, WINDOW_MS, SileroModel

    audio = _speech_with_pauses(seconds)
    # Where the VAD node would call the classifier: pauses after speech, at 200 ms, then doubling.
    silero, state, context = SileroModel(), np.zeros(STATE_SHAPE, np.float32), np.zeros(CONTEXT, np.float32)
    checks, heard_speech, silence_ms, next_check = 0, False, 0.0, 200.0
    for i in range(0, len(audio) - WINDOW + 1, WINDOW):
        window = audio[i:i + WINDOW]
        probability, state = silero.run_batch([(np.concatenate([context, window]), state)])[0]
        context = window[-CONTEXT:]
        if probability >= 0.5:
            heard_speech, silence_ms, next_check = True, 0.0, 200.0
        elif heard_speech and probability < 0.35:
            silence_ms += WINDOW_MS
            if next_check <= silence_ms <= 4000:
                checks += 1
                next_check = silence_ms * 2
    model = SmartTurnModel()
    turn = audio[-8 * 16000:]
    model.run_batch([turn])  # warm-up
    one = min(_timed(lambda: model.run_batch([turn])) for _ in range(repeats))
    batched = min(_timed(lambda: model.run_batch([turn] * sessions)) for _ in range(repeats))
    audio_s = len(audio) / 16000
    per_session_s = checks / audio_s
    return {
        "audio_s": round(audio_s, 1),
        "calls": checks,
        "calls_per_session_s": round(per_session_s, 3),
        "ms_per_call": round(one * 1000, 1),
        "ms_per_session_s": round(per_session_s * one * 1000, 2),
        "batched_sessions": sessions,
        "batched_ms_per_call": round(batched * 1000, 1),
        "batched_ms_per_turn": round(batched * 1000 / sessions, 1),
        "batched_ms_per_session_s": round(per_session_s * batched * 1000 / sessions, 2),
    }


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


# --------------------------------------------------------------------------- one spoken turn


def reply_figures(omni: Any, utterance: Any, max_output_tokens: int) -> dict[str, Any]:
    import soxr
    import torch

    from nodes.qwen3_omni.code2wav_stream import Code2WavDecoder, Code2WavStream
    from nodes.qwen3_omni.inputs import build_turn_inputs
    from nodes.qwen3_omni.media_encoders import encode_turns
    from nodes.qwen3_omni.talker_engine import TalkerHistory, TalkerModel, TalkerReply, TalkerSampling
    from nodes.qwen3_omni.thinker_engine import ThinkerSession

    audio16 = soxr.resample(utterance.samples, 24000, 16000).astype(np.float32)
    talker_model = TalkerModel(omni.model)
    decoder = Code2WavDecoder(omni.code2wav)
    clock = _Clock()
    with torch.inference_mode():
        started = time.perf_counter()
        with clock("features"):
            turn = build_turn_inputs(omni, audio=audio16, system_prompt=omni.system_prompt, add_generation_prompt=True)
        with clock("encoder"):
            encoded = encode_turns(omni, [turn.tensors()])[0]
        thinker = ThinkerSession(omni)
        with clock("prefill"):
            prefill = thinker.prefill(encoded, max_reply_tokens=max_output_tokens)
        history = TalkerHistory(talker_model)
        with clock("talker"):
            for part in prefill.user_parts:
                history.add_user_part(part.token_ids, part.multimodal_hidden)
            history.track(prefill.token_ids)
        reply = TalkerReply(talker_model, history, history.assistant_header() or list(omni.tokens.assistant_header), sampling=TalkerSampling.from_params(None), limits=_talker_limits(omni))
        stream = Code2WavStream(decoder, first_chunk_frames=1, chunk_frames=6)
        tokens = frames = 0
        audio_samples = 0
        first_audio: float | None = None
        while not reply.finished:
            if reply.ready():
                with clock("talker"):
                    frame = reply.step()
                if frame is None:
                    continue
                frames += 1
                with clock("code2wav"):
                    chunk = stream.push(frame[None])
                if chunk.numel() and first_audio is None:
                    first_audio = time.perf_counter() - started
                audio_samples += chunk.numel()
                continue
            with clock("decode"):
                step = thinker.decode_step()
            if step.token_id is not None:
                tokens += 1
            reply.add_text([step.token_id] if step.token_id is not None else [], final=step.finish_reason is not None, eos=step.finish_reason == "stop")
        with clock("code2wav"):
            audio_samples += stream.push(torch.empty(0, talker_model.num_code_groups, dtype=torch.long), final=True).numel()
        total = time.perf_counter() - started
    audio_s = audio_samples / 24000
    t = clock.totals
    return {
        "reply": {
            "input_audio_s": round(utterance.seconds, 2),
            "first_audio_ms": round((first_audio or total) * 1000, 1),
            "compute_s": round(total, 3),
            "audio_s": round(audio_s, 2),
            "rtf": round(total / audio_s, 3) if audio_s else None,
        },
        "thinker": {
            "features_ms": round(t["features"] * 1000, 1),
            "encoder_ms": round(t["encoder"] * 1000, 1),
            "prefill_tokens": prefill.new_tokens,
            "prefill_ms": round(t["prefill"] * 1000, 1),
            "decode_tokens": tokens,
            "decode_ms_per_token": round(t["decode"] / max(tokens, 1) * 1000, 2),
            "decode_tok_per_s": round(tokens / t["decode"], 1) if t["decode"] else None,
        },
        "talker": {
            "frames": frames,
            "reply_ms_per_frame": round(t["talker"] / max(frames, 1) * 1000, 2),
            "reply_frames_per_s": round(frames / t["talker"], 1) if t["talker"] else None,
        },
        "code2wav": {
            "audio_s": round(audio_s, 2),
            "compute_s": round(t["code2wav"], 3),
            "x_realtime": round(audio_s / t["code2wav"], 1) if t["code2wav"] else None,
        },
    }


def step_cost_figures(omni: Any, quick: bool = False) -> dict[str, Any]:
    """The step costs under their interface names (see the module docstring): the median decode
    step of 16 sessions, the best of three runs of talker frames (fewer steps and frames when
    `quick`: the counts are the same, the time per frame noisier)."""
    from benchmarks.step_costs import TALKER_FRAMES, code2wav_chunk_costs, talker_frame_costs, thinker_step_costs

    thinker = thinker_step_costs(omni, sessions=16, steps=2 if quick else 4)
    talker = talker_frame_costs(omni, frames=8 if quick else TALKER_FRAMES)
    chunk = code2wav_chunk_costs(omni.code2wav, chunks=((1, 6),), rounds=2 if quick else 5)["b1_f6"]
    return {
        "code2wav": {"chunk_ms": chunk["off"]["ms_per_chunk"], "chunk_ops": chunk["off"]["ops_per_chunk"],
                     "chunk_ms_captured": chunk["auto"]["ms_per_chunk"], "chunk_ops_captured": chunk["auto"]["ops_per_chunk"]},
        "thinker": {"ops_per_step_16": thinker["ops_per_step"],
                    "host_syncs_per_step": thinker["host_syncs_per_step"]},
        "talker": {"ms_per_frame": talker["ms_per_frame"], "ops_per_frame": talker["ops_per_frame"],
                   "host_syncs_per_frame": talker["host_syncs_per_frame"]},
    }


def batching_figures(omni: Any, sessions: int, repeats: int = REPEATS) -> dict[str, Any]:
    """Cross-session batching on its own: aggregate thinker decode tokens/s and talker frames/s
    for 1 session and for `sessions` at once, through the shared executors the nodes use
    (benchmarks/thinker_batching.py, talker_batching.py; best of `repeats` runs)."""
    from benchmarks import talker_batching, thinker_batching
    from nodes.qwen3_omni.talker_engine import TalkerModel

    talker = TalkerModel(omni.model)

    def best(measure, key: str, count: int) -> float:
        return max(measure(count)[key] for _ in range(repeats))

    thinker_1 = best(lambda n: thinker_batching.measure(omni, n, 32, "batched"), "tok_per_s", 1)
    thinker_n = best(lambda n: thinker_batching.measure(omni, n, 32, "batched"), "tok_per_s", sessions)
    talker_1 = best(lambda n: talker_batching.measure(omni, talker, n, 16, "batched"), "frames_per_s", 1)
    talker_n = best(lambda n: talker_batching.measure(omni, talker, n, 16, "batched"), "frames_per_s", sessions)
    return {
        "sessions": sessions,
        "thinker_tok_per_s_1": thinker_1,
        f"thinker_tok_per_s_{sessions}": thinker_n,
        "thinker_x": round(thinker_n / thinker_1, 1),
        "talker_frames_per_s_1": talker_1,
        f"talker_frames_per_s_{sessions}": talker_n,
        "talker_x": round(talker_n / talker_1, 1),
    }


def speech_figures(omni: Any, texts: list[str]) -> dict[str, Any]:
    """Stateless text-to-speech as the graph runs it: the text is the reply (talker + code2wav)."""
    import torch

    from nodes.qwen3_omni.code2wav_stream import Code2WavDecoder, Code2WavStream
    from nodes.qwen3_omni.inputs import build_turn_inputs
    from nodes.qwen3_omni.talker_engine import TalkerHistory, TalkerModel, TalkerReply, TalkerSampling

    talker_model = TalkerModel(omni.model)
    decoder = Code2WavDecoder(omni.code2wav)
    audio_samples = 0
    first_chunks = []
    started = time.perf_counter()
    with torch.inference_mode():
        for text in texts:
            request_started = time.perf_counter()
            prompt = build_turn_inputs(omni, role="user", text=None, add_generation_prompt=True)
            reply_ids = omni.tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids
            history = TalkerHistory(talker_model)
            history.add_prompt(torch.tensor(prompt.input_ids, dtype=torch.long), None)
            reply = TalkerReply(talker_model, history, history.assistant_header() or list(omni.tokens.assistant_header), sampling=TalkerSampling.from_params(None), limits=_talker_limits(omni))
            history.add_reply(reply_ids)
            reply.add_text(reply_ids, final=True)
            stream = Code2WavStream(decoder, first_chunk_frames=1, chunk_frames=6)
            first = None
            while not reply.finished:
                frame = reply.step()
                if frame is None:
                    continue
                chunk = stream.push(frame[None])
                if chunk.numel() and first is None:
                    first = time.perf_counter() - request_started
                audio_samples += chunk.numel()
            audio_samples += stream.push(torch.empty(0, talker_model.num_code_groups, dtype=torch.long), final=True).numel()
            first_chunks.append(first or time.perf_counter() - request_started)
    total = time.perf_counter() - started
    audio_s = audio_samples / 24000
    return {
        "requests": len(texts),
        "first_chunk_ms": round(min(first_chunks) * 1000, 1),
        "latency_ms": round(total / len(texts) * 1000, 1),
        "audio_s": round(audio_s, 2),
        "audio_s_per_s": round(audio_s / total, 3),
    }


def _talker_limits(omni: Any) -> Any:
    from nodes.qwen3_omni.talker_engine import TalkerLimits

    bounds = getattr(omni, "bounds", None)
    return TalkerLimits(max_frames=getattr(bounds, "max_reply_frames", 4095), max_frames_per_token=getattr(bounds, "max_frames_per_token", None))


class _Clock:
    """Accumulates wall time per named stage: `with clock("prefill"): ...`."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {"features": 0.0, "encoder": 0.0, "prefill": 0.0, "decode": 0.0, "talker": 0.0, "code2wav": 0.0}
        self._name = ""
        self._started = 0.0

    def __call__(self, name: str) -> _Clock:
        self._name = name
        return self

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def __exit__(self, *exc_info: Any) -> None:
        self.totals[self._name] = self.totals.get(self._name, 0.0) + time.perf_counter() - self._started


# --------------------------------------------------------------------------- ratios


def ratios(doc: dict[str, Any]) -> dict[str, float]:
    """Server figure / direct figure, where both were measured.

    TTFA ratios divide the server's time to first audio (from speech_stopped) by the direct
    first-audio compute of one turn; above 1 is what the server adds (queues, VAD, batching
    waits, other sessions). Throughput ratios divide the server's audio seconds per second by
    the direct sequential figure; above 1 means concurrency is paying off.
    """
    out: dict[str, float] = {}
    components = doc.get("components") or {}
    direct_first = (components.get("reply") or {}).get("first_audio_ms")
    levels = [level for level in (doc.get("realtime") or {}).get("levels", []) if level["ttfa_from_speech_stopped_ms"].get("p50") is not None]
    if direct_first:
        from benchmarks.report import level_label

        for level in levels:
            ttfa = level["ttfa_from_speech_stopped_ms"]
            out[f"realtime N={level_label(level)} TTFA p50 / direct first audio"] = round(ttfa["p50"] / direct_first, 2)
            out[f"realtime N={level_label(level)} TTFA p95 / direct first audio"] = round(ttfa["p95"] / direct_first, 2)
    direct_speech = (components.get("speech") or {}).get("audio_s_per_s")
    speech_levels = [level for level in (doc.get("speech") or {}).get("levels", []) if level["mode"] == "file" and level["ok"]]
    if direct_speech:
        for level in speech_levels:
            out[f"speech C={level['concurrency']} audio s/s / direct"] = round(level["audio_s_per_s"] / direct_speech, 2)
        batch = (doc.get("speech") or {}).get("batch") or {}
        if batch.get("audio_s_per_s"):
            out["speech batch audio s/s / direct"] = round(batch["audio_s_per_s"] / direct_speech, 2)
    direct_sfirst = (components.get("speech") or {}).get("first_chunk_ms")
    if direct_sfirst:
        for level in (doc.get("speech") or {}).get("levels", []):
            if level["mode"] == "sse" and level["first_chunk_ms"].get("p50") is not None:
                out[f"speech C={level['concurrency']} SSE first chunk p50 / direct"] = round(level["first_chunk_ms"]["p50"] / direct_sfirst, 2)
    return out
