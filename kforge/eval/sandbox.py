"""Load a candidate's launcher into a restricted namespace.

This is a fence against the known ways a generated launcher cheats, not a security boundary (the
worker process is that): the launcher sees read-only stand-ins for ``torch``, ``numpy`` and
``math`` that expose allocation, dtypes and pure math only; it cannot import anything else, reach
dunder attributes, assign attributes or keep state between calls (each call runs a fresh copy of
the module). What it does with tensors is checked at run time by ``kforge.eval.guard``.
"""

from __future__ import annotations

import ast
import builtins
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch


class Violation(BaseException):
    """A launcher did something it may not. A BaseException, so that a launcher's own
    ``except Exception`` cannot swallow it (each violation is also recorded where it happens)."""

    def __init__(self, message: str, kind: str = "cheat") -> None:
        super().__init__(message)
        self.kind = kind  # "cheat", or "copy" for a layout copy (a fixable mistake)


class LauncherSourceError(Exception):
    """The launcher source cannot be used (syntax error, no ``launch`` function)."""


# ----- static checks -----


def check_launcher_source(source: str) -> tuple[list[str], list[str]]:
    """``(errors, violations)``: plain errors (syntax, no ``launch``) and constructs a launcher
    may not use (dunder access, private attributes, attribute assignment, classes)."""
    try:
        tree = ast.parse(source, filename="launcher.py")
    except SyntaxError as exc:
        return [f"launcher line {exc.lineno}: {exc.msg}"], []
    violations: list[str] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            violations.append(f"line {line}: attribute {node.attr!r} (private and dunder "
                              "attributes are off limits)")
        elif isinstance(node, ast.Name) and node.id.startswith("__"):
            violations.append(f"line {line}: name {node.id!r}")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Attribute):
                        violations.append(f"line {line}: assigns attribute {sub.attr!r}")
        elif isinstance(node, ast.ClassDef):
            violations.append(f"line {line}: defines class {node.name!r}")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            violations.append(f"line {line}: {type(node).__name__.lower()} statement")
        elif isinstance(node, ast.Import):
            violations += [f"line {line}: imports {a.name!r} (only torch, numpy and math)"
                           for a in node.names if a.name not in IMPORTABLE]
        elif isinstance(node, ast.ImportFrom):
            violations.append(f"line {line}: from-import of {node.module!r} (use import torch, "
                              "import numpy as np or import math)")
    defines_launch = any(isinstance(n, ast.FunctionDef) and n.name == "launch" for n in tree.body)
    errors = [] if defines_launch else ["the launcher defines no top-level launch(kernels, *args)"]
    return errors, violations


# ----- the namespace -----

IMPORTABLE = ("torch", "numpy", "math")


class ReadOnly:
    """A module stand-in exposing a fixed set of attributes; anything else is a violation."""

    __slots__ = ("_name", "_refuse", "_values")

    def __init__(self, name: str, values: dict[str, Any],
                 refuse: Callable[[str], Violation]) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_refuse", refuse)

    def __getattr__(self, attr: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if attr in values:
            return values[attr]
        raise object.__getattribute__(self, "_refuse")(
            f"{object.__getattribute__(self, '_name')}.{attr}")

    def __setattr__(self, attr: str, value: Any) -> None:
        raise object.__getattribute__(self, "_refuse")(
            f"setting {object.__getattribute__(self, '_name')}.{attr}")

    def __repr__(self) -> str:
        return f"<launcher view of {object.__getattribute__(self, '_name')}>"


TORCH_ALLOCATORS = ("empty", "empty_like", "empty_strided", "zeros", "zeros_like")
TORCH_TYPES = ("Tensor", "Size", "dtype", "device", "finfo", "iinfo", "strided",
               "contiguous_format", "channels_last", "channels_last_3d", "preserve_format")
NUMPY_SCALARS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                 "float16", "float32", "float64", "intp", "uintp", "bool_")
SAFE_BUILTINS = (
    "abs", "all", "any", "bool", "dict", "divmod", "enumerate", "float", "int", "isinstance",
    "len", "list", "map", "max", "min", "range", "reversed", "round", "set", "slice", "sorted",
    "str", "sum", "tuple", "zip", "filter", "hasattr", "ArithmeticError", "AssertionError",
    "Exception", "IndexError", "KeyError", "NotImplementedError", "RuntimeError", "TypeError",
    "ValueError", "ZeroDivisionError", "None", "True", "False",
)


class Namespace:
    """The globals a launcher runs with, and the violations it committed through them."""

    def __init__(self) -> None:
        self.violations: list[Violation] = []
        torch_values = {name: getattr(torch, name) for name in TORCH_ALLOCATORS + TORCH_TYPES}
        torch_values.update({name: value for name, value in vars(torch).items()
                             if isinstance(value, torch.dtype)})
        self.torch = ReadOnly("torch", torch_values, self._refusal(
            "launchers may only allocate with torch (empty, empty_like, empty_strided, zeros)"))
        self.np = ReadOnly("numpy", {n: getattr(np, n) for n in NUMPY_SCALARS},
                           self._refusal("launchers may only use numpy's scalar types"))
        self.math = ReadOnly("math", {n: v for n, v in vars(math).items() if not n.startswith("_")},
                             self._refusal("math is read-only"))
        allowed = {name: getattr(builtins, name) for name in SAFE_BUILTINS}
        allowed["__import__"] = self._import
        self.builtins = allowed

    def _refusal(self, why: str) -> Callable[[str], Violation]:
        def refuse(what: str) -> Violation:
            violation = Violation(f"launcher used {what}: {why}")
            self.violations.append(violation)
            return violation

        return refuse

    def _import(self, name: str, globals_: Any = None, locals_: Any = None,
                fromlist: Any = None, level: int = 0) -> Any:
        # C code that PyTorch runs from inside the launcher imports through the launcher's
        # builtins too (with a list as fromlist): those imports are PyTorch's own.
        if isinstance(fromlist, list) or sys._getframe(1).f_code.co_filename != "launcher.py":
            return builtins.__import__(name, globals_, locals_, fromlist, level)
        modules = {"torch": self.torch, "numpy": self.np, "math": self.math}
        if name in modules and level == 0:
            return modules[name]
        violation = Violation(f"launcher imported {name!r}: only torch, numpy and math may be "
                              "imported")
        self.violations.append(violation)
        raise violation

    def globals(self) -> dict[str, Any]:
        return {"__builtins__": self.builtins, "__name__": "launcher", "torch": self.torch,
                "np": self.np, "numpy": self.np, "math": self.math}


class Launcher:
    """A checked launcher; ``fresh()`` gives a new ``launch`` function with fresh globals."""

    def __init__(self, source: str) -> None:
        errors, violations = check_launcher_source(source)
        if errors:
            raise LauncherSourceError("; ".join(errors))
        if violations:
            raise Violation("launcher uses what launchers may not: " + "; ".join(violations[:5]))
        self.code = compile(source, "launcher.py", "exec")
        self.namespace = Namespace()

    def fresh(self) -> Callable[..., Any]:
        scope = self.namespace.globals()
        exec(self.code, scope)  # restricted globals, checked source
        launch = scope.get("launch")
        if not callable(launch):
            raise LauncherSourceError("launch is not a function")
        return launch


# ----- the process around it -----


def _watched() -> dict[str, Any]:
    """Objects a cheat would replace to fake a fast time or a passing check."""
    from kforge.eval import compare

    watched = {
        "time.perf_counter": (time, "perf_counter"),
        "time.perf_counter_ns": (time, "perf_counter_ns"),
        "time.time": (time, "time"),
        "torch.cuda.synchronize": (torch.cuda, "synchronize"),
        "torch.cuda.current_stream": (torch.cuda, "current_stream"),
        "torch.cuda.Event.record": (torch.cuda.Event, "record"),
        "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
        "torch.cuda.Event.synchronize": (torch.cuda.Event, "synchronize"),
        "torch.cuda.Stream.synchronize": (torch.cuda.Stream, "synchronize"),
        "torch.equal": (torch, "equal"),
        "torch.allclose": (torch, "allclose"),
        "torch.Tensor.copy_": (torch.Tensor, "copy_"),
        "compare.compare_values": (compare, "compare_values"),
        "compare.compare_structure": (compare, "compare_structure"),
    }
    return {name: (owner, attr, getattr(owner, attr)) for name, (owner, attr) in watched.items()}


class Integrity:
    """Remembers the timing and checking functions at start; ``tampered()`` names any that a
    launcher replaced since."""

    def __init__(self) -> None:
        self._original = _watched()

    def tampered(self) -> list[str]:
        return [name for name, (owner, attr, value) in self._original.items()
                if getattr(owner, attr) is not value]
