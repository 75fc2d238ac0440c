"""Turn a model spec (a built-in name or ``path/to/file.py:factory``) into a model ready to run.

A model file defines a factory returning ``(model, args)`` or ``(model, args, kwargs)``: an
``nn.Module`` and example inputs for one forward. The factory may declare any of the parameters
``device``, ``dtype``, ``batch``, ``seq_len``, ``mode``, ``layers``; those it declares are passed
from the command line options (an option given for a factory without that parameter is an error).
The model is put in eval mode, moved to the device (and dtype, when one is given) with its inputs,
and every forward runs under ``torch.no_grad()``, as generation and diffusion pipelines do. (Not
``inference_mode``: without autograd in the dispatch key set, a dispatch mode would see composite
ops such as ``linear`` instead of the ``addmm``/``mm`` they run.)
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from kforge.capture import zoo
from kforge.capture.builders import Resolved
from kforge.core.argspec import dtype_name
from kforge.core.gpu import memory_of
from kforge.core.settings import MODEL_RANGES
from kforge.errors import KforgeError

T = TypeVar("T")

DTYPE_ALIASES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
    "float16": torch.float16, "half": torch.float16, "fp32": torch.float32,
    "float32": torch.float32, "float": torch.float32,
}
FACTORY_PARAMETERS = ("device", "dtype", "batch", "seq_len", "mode", "layers")


@dataclass(frozen=True)
class ModelOptions:
    """What the user asked for; None means the model's default."""

    dtype: str | None = None
    device: str | None = None
    batch: int | None = None
    seq_len: int | None = None
    mode: str | None = None
    layers: int | None = None
    seed: int = 0


@dataclass
class LoadedModel:
    """A model ready to profile or to run again exactly as profiled.

    ``prepare()`` restores per-step state, to be called outside any timing (decode: a fresh copy of
    the prefilled KV cache, made by ``reset``); ``step()`` runs one forward; ``run()`` does both.
    """

    name: str
    model: torch.nn.Module
    args: tuple
    kwargs: dict
    dtype: torch.dtype
    device: torch.device
    settings: dict = field(default_factory=dict)
    reset: Callable[[], None] | None = None

    def prepare(self) -> None:
        if self.reset is not None:
            with torch.no_grad():
                self.reset()

    def step(self) -> Any:
        with torch.no_grad():
            return self.model(*self.args, **self.kwargs)

    def run(self) -> Any:
        self.prepare()
        return self.step()


def parse_dtype(text: str) -> torch.dtype:
    try:
        return DTYPE_ALIASES[text.lower()]
    except KeyError:
        raise KforgeError(f"unknown dtype {text!r}: use one of bf16, fp16, fp32") from None


def resolve_device(text: str | None) -> torch.device:
    """``--device``, defaulting to the GPU when there is one."""
    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise KforgeError(f"unknown device {text!r}: use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise KforgeError("--device cuda was asked for but this torch sees no CUDA GPU "
                              "(use --device cpu)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise KforgeError(f"there is no {device}: this machine has "
                              f"{torch.cuda.device_count()} CUDA device(s)")
    elif device.type != "cpu":
        raise KforgeError(f"device {text!r} is not supported: use cpu, cuda or cuda:N")
    return device


def load_model(spec: str, options: ModelOptions,
               progress: Callable[[str, int, int], None] | None = None) -> LoadedModel:
    """Build or import the model named by ``spec`` and its example inputs, ready to run."""
    _check_ranges(options)
    device = resolve_device(options.device)
    if progress:
        progress("build", 0, 1)
    try:
        # Seeded weights and inputs, without disturbing the caller's random state.
        with torch.random.fork_rng(devices=_cuda_indices(device)):
            torch.manual_seed(options.seed)
            loaded = _load(spec, options, device)
    except torch.OutOfMemoryError:
        _release(device)
        raise KforgeError(f"out of {memory_of(device.type)} while building {spec} on {device}: "
                          "try a smaller --batch, --seq-len or --layers") from None
    if progress:
        progress("build", 1, 1)
    return loaded


def _load(spec: str, options: ModelOptions, device: torch.device) -> LoadedModel:
    entry = zoo.get(spec)
    if entry is not None:
        return _load_builtin(entry, options, device)
    if ":" in spec and spec.rsplit(":", 1)[0].endswith(".py"):
        return _load_factory(spec, options, device)
    names = ", ".join(zoo.MODELS)
    raise KforgeError(f"unknown model {spec!r}: use a built-in name ({names}) or "
                      "path/to/file.py:factory")


def _cuda_indices(device: torch.device) -> list[int]:
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


def _check_ranges(options: ModelOptions) -> None:
    for name, (least, most) in MODEL_RANGES.items():
        value = getattr(options, name)
        flag = f"--{name.replace('_', '-')}"
        if value is not None and value < least:
            raise KforgeError(f"{flag} must be at least {least}, not {value}")
        if value is not None and value > most:
            raise KforgeError(f"{flag} must be at most {most:,}, not {value}")


def _load_builtin(entry: zoo.ZooModel, options: ModelOptions, device: torch.device) -> LoadedModel:
    if options.mode is not None and options.mode not in entry.modes:
        runs = f"modes {', '.join(entry.modes)}" if entry.modes else "one forward (no --mode)"
        raise KforgeError(f"{entry.name} has no mode {options.mode!r}: it runs {runs}")
    if options.seq_len is not None and entry.seq_len is None:
        raise KforgeError(f"{entry.name} has no sequence length: leave out --seq-len")
    if options.layers is not None:
        if entry.layers is None:
            raise KforgeError(f"{entry.name} cannot be truncated: leave out --layers")
        if options.layers > entry.layers:
            raise KforgeError(f"{entry.name} has {entry.layers} layers; --layers "
                              f"{options.layers} asks for more")
    resolved = Resolved(
        dtype=parse_dtype(options.dtype or entry.dtype), device=device,
        batch=options.batch or entry.batch, seq_len=options.seq_len or entry.seq_len,
        mode=(options.mode or entry.modes[0]) if entry.modes else None,
        layers=options.layers or entry.layers)
    try:
        built = entry.build(resolved)
    except (KforgeError, torch.OutOfMemoryError):
        raise
    except Exception as exc:
        raise KforgeError(f"building {entry.name} on {device} in {dtype_name(resolved.dtype)} "
                          f"failed: {type(exc).__name__}: {first_line(exc)}") from None
    built.model.eval()
    return LoadedModel(
        name=entry.name, model=built.model, args=built.args, kwargs=built.kwargs,
        dtype=resolved.dtype, device=device, reset=built.reset,
        settings={"dtype": dtype_name(resolved.dtype), "device": str(device),
                  "batch": resolved.batch, "seq_len": resolved.seq_len, "mode": resolved.mode,
                  "layers": resolved.layers})


def _load_factory(spec: str, options: ModelOptions, device: torch.device) -> LoadedModel:
    path_text, factory_name = spec.rsplit(":", 1)
    path = Path(os.path.abspath(Path(path_text).expanduser()))  # no "..": one name a file
    spec = f"{path}:{factory_name}"  # stored with the session: rebuildable from any folder
    factory = _import_factory(path, factory_name)
    dtype = parse_dtype(options.dtype) if options.dtype else None
    given = {"device": device, "dtype": dtype, "batch": options.batch,
             "seq_len": options.seq_len, "mode": options.mode, "layers": options.layers}
    try:
        accepted = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        accepted = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    call_kwargs = {}
    for name in FACTORY_PARAMETERS:
        if takes_any or name in accepted:
            if given[name] is not None:
                call_kwargs[name] = given[name]
        elif given[name] is not None and name not in ("device", "dtype"):
            also = " and --seq-lengths" if name == "seq_len" else ""
            raise KforgeError(f"{spec} takes no {name!r} parameter, so "
                              f"--{name.replace('_', '-')}{also} cannot apply")
    # what the factory ran with where it was not told: its own defaults (a length to vary)
    defaults = {name: p.default for name, p in accepted.items()
                if name in FACTORY_PARAMETERS and given[name] is None
                and isinstance(p.default, (int, str)) and not isinstance(p.default, bool)}
    try:
        result = factory(**call_kwargs)
    except torch.OutOfMemoryError:
        raise
    except SystemExit as exc:
        raise KforgeError(f"{spec} called sys.exit({exc.code!r})") from None
    except Exception as exc:
        raise KforgeError(f"{spec} raised {type(exc).__name__}: {first_line(exc)}") from None
    model, args, kwargs = _unpack(spec, result)
    # the model's own methods may raise anything: each failure is one line naming it
    _model_call(spec, "eval()", model.eval)
    _model_call(spec, ".to()", lambda: model.to(device=device, dtype=dtype),
                f"cannot move {spec} to {device}")
    args, kwargs = _to(args, device, dtype), _to(kwargs, device, dtype)
    model_dtype = dtype or _model_call(spec, "parameters()", lambda: next(
        (p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32))
    return LoadedModel(
        name=spec, model=model, args=tuple(args), kwargs=kwargs, dtype=model_dtype, device=device,
        settings={"dtype": dtype_name(model_dtype), "device": str(device),
                  **{name: defaults.get(name, given[name])
                     for name in ("batch", "seq_len", "mode", "layers")}})


def _model_call(spec: str, method: str, call: Callable[[], T], said: str | None = None) -> T:
    """``call()``, one of the model's own methods; whatever it raises (but running out of GPU
    memory) is a KforgeError that begins with ``said``."""
    try:
        return call()
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:
        raise KforgeError(f"{said or f'the model of {spec} cannot be used'}: its {method} raised "
                          f"{type(exc).__name__}: {first_line(exc)}") from None


def _import_factory(path: Path, name: str) -> Callable:
    if not path.is_file():
        raise KforgeError(f"model file not found: {path}")
    module_name = f"kforge_model_{uuid.uuid4().hex[:8]}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise KforgeError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        del sys.modules[module_name]
        reason = (f"it called sys.exit({exc.code!r})" if isinstance(exc, SystemExit)
                  else f"{type(exc).__name__}: {first_line(exc)}")
        raise KforgeError(f"cannot import {path}: {reason}") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise KforgeError(f"{path} has no function {name!r} (give the factory as "
                          "path/to/file.py:function)")
    return factory


def _unpack(spec: str, result: Any) -> tuple[torch.nn.Module, tuple, dict]:
    shape_hint = "(model, args) or (model, args, kwargs)"
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise KforgeError(f"{spec} must return {shape_hint}, not {type(result).__name__}")
    model, args, kwargs = (*result, {}) if len(result) == 2 else result
    if not isinstance(model, torch.nn.Module):
        raise KforgeError(f"{spec} must return a torch.nn.Module first, not "
                          f"{type(model).__name__}")
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, (tuple, list)) or not isinstance(kwargs, dict):
        raise KforgeError(f"{spec} must return {shape_hint}: args a tuple, kwargs a dict")
    return model, tuple(args), kwargs


def _to(value: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """Move the tensors in ``value`` to ``device``; floating ones also to ``dtype`` if given."""
    if isinstance(value, torch.Tensor):
        cast = dtype if dtype is not None and value.is_floating_point() else None
        return value.to(device=device, dtype=cast) if cast else value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device, dtype) for k, v in value.items()}
    return value


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's message cut to its first line, so every error stays one line."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
