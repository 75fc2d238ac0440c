"""bench/bench_e2e.py without a GPU: its two models of its own build and run, and its tables
(with geometric means over models) come out of result records."""

from __future__ import annotations

import pytest

from bench import bench_e2e
from kforge.capture import ModelOptions, load_model


def test_the_unet_style_model_runs_in_fp16():
    loaded = load_model(f"{bench_e2e.HERE}:build_unet", ModelOptions(device="cpu", batch=1))
    out = loaded.run()
    assert loaded.dtype.is_floating_point and str(loaded.dtype) == "torch.float16"
    assert out.shape == loaded.args[0].shape == (1, 4, 32, 32)
    kinds = {type(m).__name__ for m in loaded.model.modules()}
    assert {"GroupNorm", "Conv2d", "LayerNorm", "Linear"} <= kinds


def test_the_llama_prefill_keeps_the_last_tokens_logits():
    pytest.importorskip("transformers")
    loaded = load_model(f"{bench_e2e.HERE}:build_llama",
                        ModelOptions(device="cpu", batch=1, seq_len=8, layers=1))
    assert loaded.run().logits.shape == (1, 1, bench_e2e.TINYLLAMA["vocab_size"])


def record(model: str, medians: dict[str, float], **extra) -> dict:
    return {"model": model, "winners": 3, "projected": 1.2, **extra,
            "modes": {mode: {"median_us": us, "setup_s": 2.0 if "compile" in mode else None,
                             "kernels": "6 nodes" if mode == "compile+kforge" else "",
                             "error": ""} for mode, us in medians.items()}}


def test_the_tables_show_every_mode_and_geometric_means():
    results = [record("a", {"eager": 2000.0, "eager+kforge": 1000.0, "compile": 1000.0,
                            "compile+kforge": 500.0}),
               record("b", {"eager": 800.0, "eager+kforge": 800.0, "compile": 400.0,
                            "compile+kforge": 800.0}),
               {"model": "c", "error": "RuntimeError: kforge profile failed"}]
    text = bench_e2e.tables(results)
    assert "| model | eager | eager + kforge | compile | compile + kforge |" in text
    assert "| a | 2.000 | 1.000 | 1.000 | 0.500 |" in text
    assert "| a | 1.00x | 2.00x | 2.00x | 4.00x |" in text
    assert "| **geomean** | 1.00x | 1.41x | 2.00x | 2.00x |" in text
    assert "| a | 3 | 1.200x | 2.000x | 2.000x |" in text
    assert "| b | 3 | 1.200x | 1.000x | 0.500x |" in text
    assert "| **geomean** | | | 1.414x | 1.000x |" in text
    assert "| a | - | - | 2.0 | 2.0 6 nodes |" in text
    assert text.endswith("c failed: RuntimeError: kforge profile failed")


def test_a_mode_handed_back_to_inductor_says_no_kernels_and_the_aa_control_has_a_column():
    result = record("a", {"eager": 2000.0, "compile": 1000.0, "compile+aa": 1010.0,
                          "compile+kforge": 1000.0})
    result["modes"]["compile+kforge"].update(ran=0, tried_us=1250.0)
    text = bench_e2e.tables([result])
    assert "| model | eager | compile | compile A/A (kforge, no kernels) | compile + kforge |" in (
        text)
    assert "| a | 3 | 1.200x | no kernels (tried 0.800x) |" in text
