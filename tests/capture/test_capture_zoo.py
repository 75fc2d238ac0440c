"""The built-in models: published shapes at full size (checked on the meta device) and tiny twins
that run on the CPU. Tests of a model skip where its library is not installed."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kforge.capture import ModelOptions, load_model, profile, zoo


def needs(library: str):
    return pytest.mark.skipif(importlib.util.find_spec(library) is None,
                              reason=f"{library} is not installed ({zoo.INSTALL_HINTS[library]})")


def params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_every_model_has_a_tiny_twin_built_the_same_way():
    names = [name for name, _ in zoo.listing()]
    assert {"resnet50", "sd35", "gemma4", "qwen35"} <= set(names)
    for name, model in zoo.MODELS.items():
        if not model.tiny:
            twin = zoo.get(f"{name}-tiny")
            assert twin.tiny and twin.builder == model.builder and twin.requires == model.requires
            assert twin.dtype == model.dtype and twin.modes == model.modes


@needs("transformers")
def test_gemma4_e2b_has_the_published_shapes():
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    from kforge.capture.zoo.language import gemma4_fields

    with torch.device("meta"):
        model = Gemma4ForCausalLM(Gemma4TextConfig(**gemma4_fields(tiny=False, layers=None)))
    assert params(model) == pytest.approx(4.63e9, rel=0.01)  # text decoder incl. PLE tables
    layers = model.model.layers
    assert len(layers) == 35
    assert layers[4].self_attn.q_proj.weight.shape == (8 * 512, 1536)  # full attention layer
    assert layers[0].self_attn.q_proj.weight.shape == (8 * 256, 1536)  # sliding layer
    assert layers[14].mlp.gate_proj.weight.shape == (6144, 1536)
    assert layers[15].mlp.gate_proj.weight.shape == (12288, 1536)  # KV-shared: double width


@needs("transformers")
def test_qwen35_35b_a3b_has_the_published_shapes():
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    from kforge.capture.zoo.language import qwen35_fields

    with torch.device("meta"):
        config = Qwen3_5MoeTextConfig(**qwen35_fields(tiny=False, layers=None))
        model = Qwen3_5MoeForCausalLM(config)
    assert params(model) == pytest.approx(34.66e9, rel=0.01)
    layers = model.model.layers
    assert len(layers) == 40
    assert hasattr(layers[0], "linear_attn") and hasattr(layers[3], "self_attn")
    assert layers[0].mlp.experts.gate_up_proj.shape == (256, 2 * 512, 2048)


@needs("diffusers")
def test_sd35_medium_has_the_published_shapes():
    from diffusers import AutoencoderKL, SD3Transformer2DModel

    from kforge.capture.zoo.diffusion import SD35_MEDIUM_VAE, transformer_fields

    with torch.device("meta"):
        transformer = SD3Transformer2DModel(**transformer_fields(tiny=False, layers=None))
        vae = AutoencoderKL(**SD35_MEDIUM_VAE)
    assert params(transformer) == pytest.approx(2.24e9, rel=0.01)
    blocks = transformer.transformer_blocks
    assert len(blocks) == 24 and sum(b.attn2 is not None for b in blocks) == 13
    assert vae.decoder.conv_in.in_channels == 16


def test_truncation_keeps_each_architecture_consistent():
    from kforge.capture.zoo.diffusion import transformer_fields
    from kforge.capture.zoo.language import gemma4_fields, qwen35_fields

    gemma = gemma4_fields(tiny=False, layers=20)
    assert gemma["num_hidden_layers"] == 20 and len(gemma["layer_types"]) == 20
    assert gemma["num_kv_shared_layers"] == 5  # layers 15.. still reuse earlier KV
    assert gemma["layer_types"][-1] == "full_attention"
    assert gemma4_fields(tiny=False, layers=12)["num_kv_shared_layers"] == 0
    assert gemma4_fields(tiny=False, layers=None)["num_kv_shared_layers"] == 20
    assert len(qwen35_fields(tiny=False, layers=8)["layer_types"]) == 8
    assert transformer_fields(tiny=False, layers=6)["dual_attention_layers"] == tuple(range(6))


def tiny(name: str, tmp_path, **options):
    loaded = load_model(name, ModelOptions(device="cpu", **options))
    return loaded, profile(loaded, samples_per_card=1, staging_dir=tmp_path)


def ops_of(result) -> set[str]:
    return {c.op for c in result.cards}


@needs("transformers")
def test_gemma4_tiny_prefill(tmp_path):
    loaded, result = tiny("gemma4-tiny", tmp_path)
    assert loaded.settings["mode"] == "prefill" and loaded.settings["seq_len"] == 32
    assert loaded.run().logits.shape == (2, 1, 512)  # the last token's logits, as generation
    assert {"aten.mm.default", "aten._scaled_dot_product_flash_attention_for_cpu.default"} \
        <= ops_of(result)
    attention = [c for c in result.cards if "attention" in c.op]
    assert "model.layers.0.self_attn" in result.modules[attention[0].key]
    assert result.samples_saved > 0


@needs("transformers")
def test_gemma4_tiny_decode_steps_against_a_fresh_cache_each_time(tmp_path):
    loaded, result = tiny("gemma4-tiny", tmp_path, mode="decode", seq_len=24)
    first = loaded.run().logits
    assert loaded.kwargs["past_key_values"].get_seq_length() == 25
    assert torch.equal(loaded.run().logits, first)  # the cache was reset, not grown
    assert loaded.kwargs["past_key_values"].get_seq_length() == 25
    query = [c for c in result.cards if "attention" in c.op][0].args[0]
    assert query["shape"][2] == 1  # one new token


@needs("transformers")
def test_qwen35_tiny_decode(tmp_path):
    loaded, result = tiny("qwen35-tiny", tmp_path, mode="decode")
    ops = ops_of(result)
    assert "aten.convolution.default" in ops  # the gated delta-net's causal conv1d
    assert ops & {"aten._grouped_mm.default", "aten.bmm.default", "aten.mm.default"}
    experts = [c for c in result.cards if "mlp.experts" in " ".join(result.modules[c.key])]
    assert experts


@needs("diffusers")
def test_sd35_tiny_runs_the_transformer_step_and_the_vae_decode(tmp_path):
    loaded, result = tiny("sd35-tiny", tmp_path)
    assert loaded.run().shape == (1, 3, 32, 32)
    modules = {m for paths in result.modules.values() for m in paths}
    assert any(m.startswith("transformer.transformer_blocks.0.attn") for m in modules)
    assert any(m.startswith("vae.decoder.up_blocks") for m in modules)
    assert {"aten.convolution.default", "aten.native_group_norm.default"} <= ops_of(result)


@needs("torchvision")
def test_resnet50_tiny(tmp_path):
    loaded, result = tiny("resnet50-tiny", tmp_path, dtype="fp32")
    assert loaded.run().shape == (2, 10)
    assert "aten.convolution.default" in ops_of(result)
