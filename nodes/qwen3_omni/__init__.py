"""Qwen3-Omni on the graph: the tiny checkpoint, model loading, turn inputs and the engines.

Modules: `checkpoint` (tiny checkpoint builder), `model` (OmniModel, the `qwen3_omni.model`
resource), `inputs` (one turn's chat-format tokens, audio features, image patches),
`thinker_engine` (per-session thinker with persistent KV).
"""
