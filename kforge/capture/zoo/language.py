"""Gemma 4 E2B and Qwen3.5-35B-A3B text decoders, built with transformers from published configs.

Prefill runs ``seq_len`` prompt tokens and keeps the last token's logits, as generation does. Decode
runs one new token against a KV cache holding ``seq_len`` tokens; the cache is filled once when the
model is built and a fresh copy of it is put in place before every step (outside any timing).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from kforge.capture.builders import Built, Resolved, building_on
from kforge.capture.zoo import ZooModel

_SLIDING, _FULL, _LINEAR = "sliding_attention", "full_attention", "linear_attention"

# google/gemma-4-E2B text_config: 35 layers in a 4 sliding : 1 full pattern; the last 20 layers
# reuse the KV of earlier ones and have double-width MLPs; per-layer embeddings (PLE) of width 256.
GEMMA4_E2B: dict[str, Any] = {
    "vocab_size": 262144, "hidden_size": 1536, "intermediate_size": 6144,
    "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 1,
    "head_dim": 256, "global_head_dim": 512, "num_global_key_value_heads": None,
    "attention_k_eq_v": False, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "sliding_window": 512,
    "layer_types": ([_SLIDING] * 4 + [_FULL]) * 7, "final_logit_softcapping": 30.0,
    "vocab_size_per_layer_input": 262144, "hidden_size_per_layer_input": 256,
    "num_kv_shared_layers": 20, "use_double_wide_mlp": True, "tie_word_embeddings": True,
    "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
    "rope_parameters": {
        _SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
        _FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0},
    },
}
GEMMA4_TINY: dict[str, Any] = {
    **GEMMA4_E2B,
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 10,
    "num_attention_heads": 2, "head_dim": 32, "global_head_dim": 64, "sliding_window": 16,
    "max_position_embeddings": 4096, "layer_types": ([_SLIDING] * 4 + [_FULL]) * 2,
    "vocab_size_per_layer_input": 512, "hidden_size_per_layer_input": 16,
    "num_kv_shared_layers": 4,
}

# Qwen/Qwen3.5-35B-A3B text_config: 40 layers, 3 gated delta-net (linear attention) : 1 full
# attention; 256 experts, 8 routed per token plus a shared expert.
QWEN35_35B_A3B: dict[str, Any] = {
    "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "hidden_act": "silu", "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "attention_bias": False,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "num_experts": 256, "num_experts_per_tok": 8,
    "layer_types": ([_LINEAR] * 3 + [_FULL]) * 10, "eos_token_id": 248044,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                        "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                        "mrope_interleaved": True},
}
QWEN35_TINY: dict[str, Any] = {
    **QWEN35_35B_A3B,
    "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
    "head_dim": 32, "max_position_embeddings": 4096, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "num_experts": 8,
    "num_experts_per_tok": 2, "layer_types": [_LINEAR] * 3 + [_FULL], "eos_token_id": 2,
    "rope_parameters": {**QWEN35_35B_A3B["rope_parameters"], "mrope_section": [2, 1, 1]},
}


def gemma4_fields(tiny: bool, layers: int | None) -> dict[str, Any]:
    """The Gemma 4 config, truncated to ``layers`` keeping the KV-sharing boundary in place."""
    fields = copy.deepcopy(GEMMA4_TINY if tiny else GEMMA4_E2B)
    depth = fields["num_hidden_layers"]
    if layers is not None and layers < depth:
        first_shared = depth - fields["num_kv_shared_layers"]
        types = fields["layer_types"][:layers]
        types[-1] = _FULL  # Gemma 4 ends on a full-attention layer
        fields.update(num_hidden_layers=layers, layer_types=types,
                      num_kv_shared_layers=max(0, layers - first_shared))
    return fields


def qwen35_fields(tiny: bool, layers: int | None) -> dict[str, Any]:
    fields = copy.deepcopy(QWEN35_TINY if tiny else QWEN35_35B_A3B)
    if layers is not None and layers < fields["num_hidden_layers"]:
        fields.update(num_hidden_layers=layers, layer_types=fields["layer_types"][:layers])
    return fields


def build_gemma4(entry: ZooModel, resolved: Resolved) -> Built:
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    config = Gemma4TextConfig(**gemma4_fields(entry.tiny, resolved.layers))
    return _decoder(Gemma4ForCausalLM, config, resolved)


def build_qwen35(entry: ZooModel, resolved: Resolved) -> Built:
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    config = Qwen3_5MoeTextConfig(**qwen35_fields(entry.tiny, resolved.layers))
    return _decoder(Qwen3_5MoeForCausalLM, config, resolved)


def _decoder(model_class: Any, config: Any, resolved: Resolved) -> Built:
    with building_on(resolved.device, resolved.dtype):
        model = model_class._from_config(config, dtype=resolved.dtype)
    model.eval()
    batch, seq_len = resolved.batch, resolved.seq_len
    prompt = torch.randint(config.vocab_size, (batch, seq_len), device=resolved.device)
    if resolved.mode == "prefill":
        return Built(model, (), {"input_ids": prompt, "use_cache": True, "logits_to_keep": 1})
    with torch.no_grad():
        prefilled = model(input_ids=prompt, use_cache=True, logits_to_keep=1).past_key_values
    kwargs: dict[str, Any] = {
        "input_ids": torch.randint(config.vocab_size, (batch, 1), device=resolved.device),
        "past_key_values": None, "use_cache": True, "logits_to_keep": 1}

    def fresh_cache() -> None:
        kwargs["past_key_values"] = copy.deepcopy(prefilled)

    fresh_cache()
    return Built(model, (), kwargs, reset=fresh_cache)
