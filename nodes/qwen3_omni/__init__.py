"""Qwen3-Omni on the graph: the tiny checkpoint, model loading, turn inputs and the engines.

Modules: `checkpoint` (tiny checkpoint builder), `model` (OmniModel, the `qwen3_omni.model`
resource), `inputs` (one turn's chat-format tokens, audio features, image patches),
`media_encoders` (audio/image encoders batched across turns), `thinker_engine` (per-session
thinker with persistent KV). H1b's `talker_engine` and `code2wav_stream` complete the reply side.
"""
