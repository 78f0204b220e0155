"""The GPU bench script runs end to end on CPU with the 30B-A3B layout shrunk 16 times."""

from __future__ import annotations

import json

import yaml

from benchmarks import random_30b
from nodes.qwen3_omni.random_presets import qwen3_omni_30b_a3b_config


def test_the_preset_is_the_published_30b_a3b_layout():
    config = qwen3_omni_30b_a3b_config()
    text = config.thinker_config.text_config
    assert (text.num_hidden_layers, text.hidden_size, text.num_attention_heads, text.num_key_value_heads) == (48, 2048, 32, 4)
    assert (text.num_experts, text.num_experts_per_tok, text.moe_intermediate_size, text.vocab_size) == (128, 8, 768, 152064)
    talker = config.talker_config
    assert (talker.text_config.num_hidden_layers, talker.text_config.hidden_size, talker.text_config.num_experts_per_tok) == (20, 1024, 6)
    assert (talker.num_code_groups, talker.accept_hidden_layer, config.code2wav_config.decoder_dim) == (16, 24, 1536)


def test_the_gpu_bench_script_runs_on_cpu_with_the_model_shrunk(tmp_path):
    code = random_30b.main(["--device", "cpu", "--dtype", "float32", "--shrink", "16", "--sessions", "1",
                            "--quick", "--out", str(tmp_path), "--name", "cpu"])
    assert code == 0
    report = json.loads((tmp_path / "cpu.json").read_text())
    assert report["server"]["model_id"] == "qwen3-omni-random-30b-a3b"
    [level] = report["realtime"]["levels"]
    assert level["errors"]["count"] == 0 and level["turns_completed"] == level["turns_planned"] > 0
    assert level["ttfa_from_speech_stopped_ms"]["p50"] > 0
    served = yaml.safe_load((tmp_path / "cpu-input-profile.yaml").read_text())["resources"]["omni"]["params"]
    assert (served["random_weights"], served["random_shrink"], served["device"]) == ("qwen3-omni-30b-a3b", 16, "cpu")
