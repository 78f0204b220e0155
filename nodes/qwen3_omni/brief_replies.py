"""Teach the tiny checkpoint's thinker to answer briefly and end its turn.

Random weights never choose `<|im_end|>`, so every reply of the embedded default would run into
the serving cap. `teach_brief_replies` trains the thinker's text model and `lm_head` for a few
seconds, at build time, on a small synthetic corpus of chat-formatted conversations, so that
greedy decoding answers every turn, spoken or written, with `REPLY` and then `<|im_end|>`:

    <|im_start|>assistant\n  ->  Okay, sure!<|im_end|>      (11 tokens, then EOS)

No character repeats in `REPLY`, so each of its tokens names the next one: the model only has to
learn to start it after the assistant header. (A phrase with a repeated character, or one phrase
per kind of turn, needs position and context; at the same training cost those came out garbled.)

The corpus is what a session's KV holds: an optional system prompt (the default one, random
instructions, now and then a long one like a tool list), one to four exchanges, user turns of
words, random printable text or audio (optionally followed by text), assistant turns of other
text (items a client created, replies cut short), and replies asked for with no new user turn.
Audio turns carry the frozen audio tower's output for synthetic clips (voiced tones, noise,
silence, 0.3-8 s): the thinker learns to answer any audio, not a voice. Only the replies are
trained on; everything else is context.

It stays a fixture: nothing here is a language model, and the rest of the checkpoint (audio and
vision towers, talker, code2wav) keeps its shaped random weights. The `lm_head` rows that
`_shape_random_weights` zeroed stay zero (their logits stay 0) except `<|im_end|>`'s, so text
is still printable ASCII. Deterministic: the corpus comes from `seed`, and training runs on one
thread (a different thread count may sum in another order).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

REPLY = "Okay, sure!"

_STEPS = 50  # ~45 ms each on one core
_BATCH = 8
_LEARNING_RATE = 6e-3  # decays linearly to 0
_AUDIO_CLIPS = 24
_WORDS = (
    "the a what is how can you tell me about weather today in paris hello hi please thanks time it "
    "do i want to know why where when who one two three ok yes no good morning name your my speak "
    "like pirate answer briefly say again stop wait"
).split()


@dataclass
class _Conversation:
    tokens: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)  # -100: context, not trained on
    audio: list[tuple[int, Any]] = field(default_factory=list)  # (first audio_pad position, embeddings)

    def add(self, tokens: list[int], train: bool = False) -> None:
        self.tokens += tokens
        self.labels += tokens if train else [-100] * len(tokens)


class _Corpus:
    """Random conversations in the tiny chat format, drawn from one seed."""

    def __init__(self, tokenizer, ids: dict[str, int], audio_pool: list[Any], rng: random.Random,
                 system_prompt: str):
        self.rng = rng
        self.audio_pool = audio_pool
        self.system_prompt = system_prompt
        self.encode = lambda text: tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids
        self.im_start, self.im_end = ids["<|im_start|>"], ids["<|im_end|>"]
        self.newline = self.encode("\n")[0]
        self.roles = {role: ids[role] for role in ("system", "user", "assistant")}
        self.audio_start, self.audio_pad, self.audio_end = (
            ids["<|audio_start|>"], ids["<|audio_pad|>"], ids["<|audio_end|>"])
        self.reply = self.encode(REPLY)

    def header(self, role: str) -> list[int]:
        return [self.im_start, self.roles[role], self.newline]

    def text(self, longest: int = 40) -> str:
        rng = self.rng
        if rng.random() < 0.7:
            text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 30 if rng.random() < 0.2 else 10)))
        else:
            text = "".join(chr(rng.randint(32, 126)) for _ in range(rng.randint(1, longest)))
        if rng.random() < 0.5:
            text = text.capitalize() + rng.choice(("?", ".", "!", ""))
        return text

    def conversation(self) -> _Conversation:
        rng, conv = self.rng, _Conversation()
        if rng.random() < 0.85:
            kind = rng.random()
            prompt = self.system_prompt if kind < 0.55 else self.text(400 if kind > 0.9 else 40)
            conv.add(self.header("system") + self.encode(prompt) + [self.im_end, self.newline])
        for exchange in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
            if exchange == 0 or rng.random() < 0.9:  # else: a reply asked for with no new user turn
                conv.add(self.header("user"))
                if rng.random() < 0.5:
                    clip = rng.choice(self.audio_pool)
                    conv.add([self.audio_start])
                    conv.audio.append((len(conv.tokens), clip))
                    conv.add([self.audio_pad] * clip.shape[0] + [self.audio_end])
                    if rng.random() < 0.2:
                        conv.add(self.encode(self.text()))
                else:
                    conv.add(self.encode(self.text()))
                conv.add([self.im_end, self.newline])
            conv.add(self.header("assistant"))
            if rng.random() < 0.15:  # an assistant item the client wrote, or a reply cut short
                other = self.encode(self.text()) if rng.random() < 0.5 else self.reply[: rng.randint(1, len(self.reply))]
                conv.add(other + [self.im_end, self.newline])
                continue
            conv.add(self.reply + [self.im_end], train=True)
            conv.add([self.newline])
        return conv


def _synthetic_clip(rng: random.Random, feature_extractor) -> tuple[Any, int]:
    """Log-mel features of 0.3-8 s of voiced tones, noise or silence at 16 kHz."""
    import torch

    rate = 16000
    t = np.arange(int(rate * rng.uniform(0.3, 8.0 if rng.random() < 0.25 else 3.0))) / rate
    kind = rng.random()
    if kind < 0.6:  # a vibrato'd harmonic tone with a syllable-like envelope
        f0, vibrato = rng.uniform(80, 300), 1 + 0.1 * np.sin(2 * np.pi * rng.uniform(0.5, 3) * t)
        samples = sum(np.sin(2 * np.pi * f0 * h * t * vibrato) / h for h in range(1, 8))
        samples *= (0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(1, 5) * t)) ** 2
    elif kind < 0.85:
        samples = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(t.size)
    else:
        samples = np.zeros(t.size)
    samples = samples / (np.abs(samples).max() + 1e-9) * rng.uniform(0.0, 0.8)
    out = feature_extractor(samples.astype(np.float32), sampling_rate=rate, return_attention_mask=True,
                            padding="longest", truncation=False, return_tensors="pt")
    frames = int(out["attention_mask"][0].sum())
    return out["input_features"][:, :, :frames].to(torch.float32), frames


def teach_brief_replies(model, tokenizer, ids: dict[str, int], feature_extractor, seed: int,
                        system_prompt: str) -> None:
    """Train `model.thinker` in place (see the module docstring); the model is left in eval mode."""
    import torch

    rng = random.Random(seed)
    thinker = model.thinker
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        audio_pool = []
        with torch.no_grad():
            for _ in range(_AUDIO_CLIPS):
                features, frames = _synthetic_clip(rng, feature_extractor)
                mask = torch.ones(1, frames, dtype=torch.long)
                audio_pool.append(thinker.get_audio_features(features, feature_attention_mask=mask).last_hidden_state)
        corpus = _Corpus(tokenizer, ids, audio_pool, rng, system_prompt)

        trained = [*thinker.model.parameters(), thinker.lm_head.weight]
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        for parameter in trained:
            parameter.requires_grad_(True)
        head = thinker.lm_head.weight
        may_win = head.detach().abs().sum(dim=-1) > 0
        may_win[ids["<|im_end|>"]] = True
        hook = head.register_hook(lambda grad: grad * may_win[:, None].to(grad.dtype))
        optimizer = torch.optim.AdamW(trained, lr=_LEARNING_RATE, weight_decay=0.0)
        decay = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / _STEPS)
        thinker.train()
        for batch in _batches_of_like_length(corpus, rng):
            labels, embeds = _tensors(batch, thinker, ids["<|endoftext|>"])
            logits = thinker.lm_head(thinker.model(inputs_embeds=embeds).last_hidden_state)
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            decay.step()
        hook.remove()
    finally:
        torch.set_num_threads(threads)
        thinker.eval()
        for parameter in model.parameters():
            parameter.requires_grad_(True)


def _batches_of_like_length(corpus: _Corpus, rng: random.Random) -> list[list[_Conversation]]:
    """`_STEPS` batches of `_BATCH` conversations, each batch of similar lengths (half the padding
    of random batches), in random order."""
    conversations = sorted((corpus.conversation() for _ in range(_STEPS * _BATCH)), key=lambda c: len(c.tokens))
    batches = [conversations[i : i + _BATCH] for i in range(0, len(conversations), _BATCH)]
    rng.shuffle(batches)
    return batches


def _tensors(conversations: list[_Conversation], thinker, pad_id: int):
    """Right-padded labels and input embeddings (audio positions hold the clips' embeddings).

    Text and audio positions are sequential in Qwen3-Omni's rope index, so the text model's default
    positions are the ones serving uses; right padding is invisible to a causal model."""
    import torch

    length = max(len(c.tokens) for c in conversations)
    tokens = torch.full((len(conversations), length), pad_id, dtype=torch.long)
    labels = torch.full((len(conversations), length), -100, dtype=torch.long)
    for row, conv in enumerate(conversations):
        tokens[row, : len(conv.tokens)] = torch.tensor(conv.tokens)
        labels[row, : len(conv.labels)] = torch.tensor(conv.labels)
    embeds = thinker.model.get_input_embeddings()(tokens).clone()
    for row, conv in enumerate(conversations):
        for start, clip in conv.audio:
            embeds[row, start : start + clip.shape[0]] = clip
    return labels, embeds
