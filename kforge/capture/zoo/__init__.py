"""The built-in models: public architectures rebuilt from their published configs, random weights.

Weights do not change which kernels run, so nothing is downloaded: each model is built directly on
the target device in its published dtype. Every model has a ``-tiny`` twin (same module code, few
layers, small widths) for CPU tests. Importing this module is cheap; a model's library (torchvision,
diffusers, transformers) is imported only when that model is built.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kforge.errors import KforgeError

if TYPE_CHECKING:
    from kforge.capture.builders import Built, Resolved

LANGUAGE_MODES = ("prefill", "decode")

# How to get each optional library: torchvision must be the build made for the installed torch.
INSTALL_HINTS = {
    "torchvision": "pip install 'kforge[vision]', or torchvision from the index your torch "
                   "came from",
    "diffusers": "pip install 'kforge[models]'",
    "transformers": "pip install 'kforge[models]'",
}


@dataclass(frozen=True)
class ZooModel:
    """One built-in model and the defaults it is profiled with."""

    name: str
    description: str
    builder: str  # "module:function" under kforge.capture.zoo, called as builder(model, resolved)
    requires: str  # the optional library it is built with
    dtype: str
    batch: int
    seq_len: int | None = None  # None: the model has no sequence length
    modes: tuple[str, ...] = ()  # the run modes it has; empty: a single forward
    layers: int | None = None  # the published depth, which --layers may truncate
    tiny: bool = False

    def build(self, resolved: Resolved) -> Built:
        if importlib.util.find_spec(self.requires) is None:
            raise KforgeError(f"the {self.name} model needs {self.requires}: "
                              f"{INSTALL_HINTS[self.requires]}")
        module_name, function = self.builder.split(":")
        try:
            builder: Callable[[ZooModel, Any], Built] = getattr(
                importlib.import_module(f"kforge.capture.zoo.{module_name}"), function)
            return builder(self, resolved)
        except ImportError as exc:
            if (broken := broken_torchvision(exc)) is not None:
                raise KforgeError(f"the {self.name} model cannot be built: the installed "
                                  f"torchvision does not work with this torch ({broken}), and "
                                  f"{self.requires} imports it; uninstall torchvision, or install "
                                  f"the build made for your torch") from None
            raise KforgeError(f"the {self.name} model needs a newer {self.requires} ({exc}): "
                              f"{INSTALL_HINTS[self.requires]}") from None


def broken_torchvision(exc: BaseException) -> str | None:
    """What a torchvision made for another torch build said while ``exc`` was raised (its
    operators are missing), or None where torchvision played no part."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if "torchvision::" in str(cause):
            return str(cause)
        cause = cause.__cause__ or cause.__context__
    return None


def _pair(name: str, description: str, builder: str, requires: str, *, dtype: str,
          batch: int, tiny_batch: int, seq_len: int | None = None, tiny_seq_len: int | None = None,
          modes: tuple[str, ...] = (), layers: int | None = None,
          tiny_layers: int | None = None) -> tuple[ZooModel, ZooModel]:
    """A model and its tiny twin."""
    full = ZooModel(name, description, builder, requires, dtype, batch, seq_len, modes, layers)
    tiny = ZooModel(f"{name}-tiny", f"tiny {name} for CPU tests (same module code)", builder,
                    requires, dtype, tiny_batch, tiny_seq_len, modes, tiny_layers, tiny=True)
    return full, tiny


MODELS: dict[str, ZooModel] = {m.name: m for m in (
    *_pair("resnet50", "ResNet-50 (torchvision), fp16, 224x224 images, batch 32",
           "vision:build_resnet50", "torchvision", dtype="float16", batch=32, tiny_batch=2),
    *_pair("sd35", "Stable Diffusion 3.5 Medium (diffusers), bf16, 1024x1024: one MMDiT step with "
           "classifier-free guidance, then the VAE decode; seq-len = prompt tokens",
           "diffusion:build_sd35", "diffusers", dtype="bfloat16", batch=1, tiny_batch=1,
           seq_len=333, tiny_seq_len=16, layers=24, tiny_layers=2),
    *_pair("gemma4", "Gemma 4 E2B text decoder (transformers), bf16, prefill or decode",
           "language:build_gemma4", "transformers", dtype="bfloat16", batch=1, tiny_batch=2,
           seq_len=2048, tiny_seq_len=32, modes=LANGUAGE_MODES, layers=35, tiny_layers=10),
    *_pair("qwen35", "Qwen3.5-35B-A3B MoE text decoder (transformers), bf16, prefill or decode",
           "language:build_qwen35", "transformers", dtype="bfloat16", batch=1, tiny_batch=2,
           seq_len=2048, tiny_seq_len=32, modes=LANGUAGE_MODES, layers=40, tiny_layers=4),
)}


def get(name: str) -> ZooModel | None:
    return MODELS.get(name)


def listing() -> list[tuple[str, str]]:
    """``(name, description)`` of every built-in model, in registry order."""
    return [(m.name, m.description) for m in MODELS.values()]
