"""The talker's shared half, loaded once per model: handles, codec special ids, tts embeddings.

`TalkerModel` is what every reply of one talker reads (talker_engine.py's `TalkerReply`, the
history, the slot cache, the captured frame unit); it lives apart from the engine so that those
modules import it without importing the engine (no import circle).
"""

from __future__ import annotations

from typing import Any

import torch

from nodes.qwen3_omni.compute_graphs import check_graphs, graphs_of
from nodes.qwen3_omni.code_predictor import CodePredictor

__all__ = ["TalkerModel"]


class _RopeView:
    """The talker as `get_rope_index` reads it, with the thinker's audio window.

    transformers' `talker.get_rope_index` reads `config.audio_config.n_window`, which the talker
    config lacks, so a user turn with an image AND audio makes `generate()` fail. This view gives
    it the talker's token ids and merge size plus the thinker's audio config; for turns it can
    handle, the positions are the same.
    """

    def __init__(self, talker: Any, audio_config: Any):
        self._talker = talker
        self.spatial_merge_size = talker.spatial_merge_size
        self.config = _ConfigView(talker.config, audio_config)

    def get_llm_pos_ids_for_vision(self, *args: Any) -> torch.Tensor:
        return self._talker.get_llm_pos_ids_for_vision(*args)


class _ConfigView:
    def __init__(self, config: Any, audio_config: Any):
        self._config = config
        self.audio_config = audio_config

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


class TalkerModel:
    """The shared half: model handles, codec special ids and the tts special embeddings."""

    def __init__(self, model: Any, graphs: str | None = None):
        self.model = model
        # `compute: {graphs}`: "auto" runs decode frames as one captured unit where it applies
        # (captured.py), "off" the eager path. None: what `compute_graphs.set_graphs` set on the model.
        self.graphs = check_graphs(graphs) if graphs is not None else graphs_of(model)
        self.frame_unit: Any = None  # captured.FrameUnit, built at the first decode frame
        self.talker = model.talker
        self.thinker_embeddings = model.thinker.get_input_embeddings()
        config = model.config
        talker_config = config.talker_config
        self.config = config
        self.talker_config = talker_config
        self.num_code_groups = int(talker_config.num_code_groups)
        self.codec_eos_id = int(talker_config.codec_eos_token_id)
        self.accept_hidden_layer = int(talker_config.accept_hidden_layer)
        self.speakers = {name.lower(): int(sid) for name, sid in (talker_config.speaker_id or {}).items()}
        if not self.speakers:
            raise ValueError("the checkpoint's talker config names no speakers (talker_config.speaker_id)")
        self.multimodal_ids = {
            int(config.thinker_config.audio_token_id),
            int(config.thinker_config.image_token_id),
            int(config.thinker_config.video_token_id),
        }
        self.im_start_id = int(config.im_start_token_id)
        self.user_id = int(config.user_token_id)
        self.assistant_id = int(config.assistant_token_id)
        self.tts_pad_id = int(config.tts_pad_token_id)
        vocab = int(talker_config.text_config.vocab_size)
        self.vocab_size = vocab
        # The top 1024 ids are codec specials and speakers; only codec EOS may be predicted.
        self.suppressed_ids = [i for i in range(vocab - 1024, vocab) if i != self.codec_eos_id]
        self.device = next(self.talker.parameters()).device
        self.suppress_mask = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        self.suppress_mask[self.suppressed_ids] = True
        self.code_predictor = CodePredictor(self.talker, self.num_code_groups)
        self.rope_view = _RopeView(self.talker, config.thinker_config.audio_config)
        with torch.inference_mode():
            specials = torch.tensor(
                [[config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]], device=self.device
            )
            embeds = self.talker.text_projection(self.thinker_embeddings(specials))
            self.tts_bos, self.tts_eos, self.tts_pad = embeds.chunk(3, dim=1)  # 3 x [1, 1, D]
            self._assistant_codec = self.talker.get_input_embeddings()(
                torch.tensor(
                    [
                        [
                            talker_config.codec_nothink_id,
                            talker_config.codec_think_bos_id,
                            talker_config.codec_think_eos_id,
                            0,  # speaker slot, filled per reply
                            talker_config.codec_pad_id,
                            talker_config.codec_bos_id,
                        ]
                    ],
                    device=self.device,
                )
            )

    # ------------------------------------------------------------------ voices

    @property
    def default_speaker(self) -> str:
        """`generate()`'s default speaker (Ethan) when the checkpoint has it, else the first one."""
        return "ethan" if "ethan" in self.speakers else next(iter(self.speakers))

    def speaker_id(self, speaker: str | None) -> int:
        """The codec id of a checkpoint speaker (case-insensitive); None picks the default."""
        name = (speaker or self.default_speaker).lower()
        if name not in self.speakers:
            raise KeyError(f"unknown speaker {speaker!r}; the checkpoint has {sorted(self.speakers)}")
        return self.speakers[name]

    # ------------------------------------------------------------------ embeddings

    @torch.inference_mode()
    def text_embeds(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Talker-space embeddings of text tokens [n] -> [n, D]."""
        ids = token_ids.to(self.device, torch.long)
        return self.talker.text_projection(self.thinker_embeddings(ids))

    @torch.inference_mode()
    def prompt_embeds(self, token_ids: torch.Tensor, mm_hidden: torch.Tensor | None) -> torch.Tensor:
        """Talker-space embeddings of prompt tokens [L] -> [L, D].

        `mm_hidden` holds the thinker's layer-`accept_hidden_layer` hidden states, either for the
        multimodal positions only ([n_mm, H], in order) or for all positions ([L, H]).
        """
        ids = token_ids.to(self.device, torch.long)
        mm_mask = torch.zeros_like(ids, dtype=torch.bool)
        for mm_id in self.multimodal_ids:
            mm_mask |= ids == mm_id
        out = torch.empty(
            (ids.shape[0], self.talker_config.text_config.hidden_size), device=self.device, dtype=self.talker.dtype
        )
        n_mm = int(mm_mask.sum())
        if n_mm:
            if mm_hidden is None:
                raise ValueError("prompt has audio/image positions but no thinker hidden states for them")
            hidden = mm_hidden.to(self.device)
            if hidden.shape[0] == ids.shape[0] and hidden.shape[0] != n_mm:
                hidden = hidden[mm_mask]
            if hidden.shape[0] != n_mm:
                raise ValueError(f"got {hidden.shape[0]} multimodal hidden states for {n_mm} multimodal positions")
            out[mm_mask] = self.talker.hidden_projection(hidden).to(out.dtype)
        text_ids = ids[~mm_mask]
        if text_ids.numel():
            out[~mm_mask] = self.talker.text_projection(self.thinker_embeddings(text_ids)).to(out.dtype)
        return out
