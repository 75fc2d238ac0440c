"""Turning a model spec into a runnable model, and the one-line errors for bad input."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from kforge.capture import ModelOptions, load_model
from kforge.errors import KforgeError

TOY = Path(__file__).with_name("capture_toy.py")


def load(spec: str, **options):
    return load_model(spec, ModelOptions(device="cpu", **options))


def error(spec: str, **options) -> str:
    with pytest.raises(KforgeError) as caught:
        load(spec, **options)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_factory_options_reach_the_factory_and_the_settings():
    loaded = load(f"{TOY}:build", batch=3, seq_len=5, dtype="fp16")
    assert loaded.args[0].shape == (3, 5, 16)
    assert loaded.args[0].dtype == torch.float16 and loaded.dtype == torch.float16
    assert all(p.dtype == torch.float16 for p in loaded.model.parameters())
    assert not loaded.model.training
    assert loaded.settings == {"dtype": "float16", "device": "cpu", "batch": 3, "seq_len": 5,
                               "mode": None, "layers": None}
    assert loaded.run().shape == (3, 4, 16)


def test_factory_may_return_kwargs():
    loaded = load(f"{TOY}:build_with_kwargs")
    assert loaded.args == () and set(loaded.kwargs) == {"x"}
    assert loaded.run().shape == (2, 7, 16)


def test_factory_problems_are_named(tmp_path):
    assert error(str(tmp_path / "nowhere.py") + ":build").startswith("model file not found")
    assert "has no function 'missing'" in error(f"{TOY}:missing")
    assert error(f"{TOY}:broken").endswith("raised ValueError: no weights here")
    assert "must return (model, args) or (model, args, kwargs), not Toy" in error(
        f"{TOY}:no_inputs")
    assert "torch.nn.Module first, not str" in error(f"{TOY}:not_a_model")
    assert "takes no 'mode' parameter" in error(f"{TOY}:build", mode="decode")
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\ndef broken(:\n")
    assert error(f"{bad}:build").startswith(f"cannot import {bad}: SyntaxError")


def test_unknown_names_and_options_are_named():
    assert "unknown model 'gpt9'" in error("gpt9")
    assert "resnet50" in error("gpt9")  # the message lists the built-in names
    assert "unknown dtype 'int3'" in error(f"{TOY}:build", dtype="int3")
    assert "must be at least 1" in error(f"{TOY}:build", batch=0)
    assert "has no mode 'decode'" in error("resnet50-tiny", mode="decode")
    assert "has no sequence length" in error("resnet50-tiny", seq_len=4)
    assert "cannot be truncated" in error("resnet50-tiny", layers=1)
    assert "has 24 layers" in error("sd35", layers=99)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without GPU")
def test_asking_for_a_missing_gpu_is_an_error():
    with pytest.raises(KforgeError, match="sees no CUDA GPU"):
        load_model(f"{TOY}:build", ModelOptions(device="cuda"))


def test_default_device_is_the_cpu_without_a_gpu():
    loaded = load_model(f"{TOY}:build", ModelOptions())
    assert loaded.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize(("name", "library", "hint"), [
    ("sd35-tiny", "diffusers", "pip install 'kforge[models]'"),
    ("gemma4-tiny", "transformers", "pip install 'kforge[models]'"),
    ("resnet50-tiny", "torchvision", "pip install 'kforge[vision]'"),
])
def test_a_missing_library_names_what_to_install(monkeypatch, name, library, hint):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda mod, *a: None if mod == library else real(mod, *a))
    message = error(name)
    assert message.startswith(f"the {name} model needs {library}:") and hint in message


def test_a_built_in_model_that_fails_to_build_is_one_clear_error(monkeypatch):
    pytest.importorskip("transformers")
    from kforge.capture.zoo import language

    def explode(entry, resolved):
        raise RuntimeError("bad config\nwith details")

    monkeypatch.setattr(language, "build_gemma4", explode)
    assert error("gemma4-tiny") == ("building gemma4-tiny on cpu in bfloat16 failed: "
                                    "RuntimeError: bad config")


def test_a_torchvision_made_for_another_torch_is_named_as_the_fault(monkeypatch):
    pytest.importorskip("transformers")
    from kforge.capture.zoo import language

    def transformers_importing_a_broken_torchvision(entry, resolved):
        try:
            raise RuntimeError("operator torchvision::nms does not exist")
        except RuntimeError as exc:
            raise ModuleNotFoundError("Could not import module 'LlamaConfig'") from exc

    monkeypatch.setattr(language, "build_gemma4", transformers_importing_a_broken_torchvision)
    message = error("gemma4-tiny")
    assert "the installed torchvision does not work with this torch" in message
    assert "operator torchvision::nms does not exist" in message and "newer" not in message


def test_a_relative_model_file_is_named_by_its_absolute_path(monkeypatch):
    monkeypatch.chdir(TOY.parent)
    assert load("capture_toy.py:build").name == f"{TOY}:build"


def test_a_model_file_path_through_a_parent_step_is_named_without_it(monkeypatch):
    monkeypatch.chdir(TOY.parent)
    assert load(f"../{TOY.parent.name}/capture_toy.py:build").name == f"{TOY}:build"
