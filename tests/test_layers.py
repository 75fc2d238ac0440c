"""The import contract: kforge's layers read bottom up from the tree, and no module imports a
layer above its own.

    core  <-  runtime  <-  capture, store  <-  eval, propose  <-  engine, integrate  <-  app
         <-  cli

``app`` holds the use cases that the command line and ``kforge_tui`` call; nothing below it
imports it. Inside ``eval`` the verification pipeline lies below the process side that runs it
(``eval.verify <- eval.process``). No module reaches itself through what it imports: the modules
form no circle. ``kforge/`` never imports Textual or ``kforge_tui``; ``kforge_tui`` never imports
torch, directly or through what it imports. No two public classes of ``kforge/`` share a name.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"core": 0, "errors": 0, "runtime": 1, "capture": 2, "store": 2, "eval": 3,
          "propose": 3, "engine": 4, "integrate": 4, "app": 5, "cli": 6, "__init__": 6,
          "__main__": 6}


# Rooms inside a layer, bottom up: a room may not import one above it.
ROOMS = {"kforge.eval.verify": 0, "kforge.eval.process": 1}


def room_of(module: str) -> int | None:
    return next((rank for room, rank in ROOMS.items()
                 if module == room or module.startswith(room + ".")), None)


def layer_of(module: str) -> int:
    """The layer of a module named ``kforge.<part>...``."""
    parts = module.split(".")
    part = parts[1] if len(parts) > 1 else "__init__"
    if part not in LAYERS:
        raise AssertionError(f"{module} lies in no layer: add kforge/{part} to the contract")
    return LAYERS[part]


def is_module(name: str) -> bool:
    """Whether ``name`` is a kforge module or package (not a name defined in one)."""
    path = ROOT.joinpath(*name.split("."))
    return name.startswith("kforge.") and (path.is_dir() or path.with_suffix(".py").exists())


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1] if len(parts) > 2 else [parts[0], "__init__"]
    return ".".join(parts)


def imports(path: Path, module: str | None = None) -> list[tuple[int, str]]:
    """Every module ``path`` (module ``module``) imports, anywhere in it (functions and
    TYPE_CHECKING included)."""
    found = []
    package = (module or module_name(path)).rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names
                      if is_module(f"{base}.{alias.name}")]
    return found


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_no_room_imports_a_room_above_its_own():
    upward = []
    for path in sources("kforge"):
        me = room_of(module_name(path))
        for line, target in imports(path):
            theirs = room_of(target)
            if me is not None and theirs is not None and theirs > me:
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert upward == []


def test_kforge_modules_form_no_import_circle():
    """Each module's imports (lazy ones included) lead only to modules that never lead back."""
    graph: dict[str, set[str]] = {}
    for path in sources("kforge"):
        me = module_name(path)
        graph[me] = {t for _, t in imports(path, me) if t.startswith("kforge.") and t != me}
    graph = {m: {t for t in targets if t in graph} for m, targets in graph.items()}
    circles, state = [], {}  # state: 1 on the current path, 2 finished

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_no_kforge_module_imports_a_layer_above_its_own():
    upward = []
    for path in sources("kforge"):
        me = module_name(path)
        for line, target in imports(path):
            # The root package (its version, the lazy ``kforge.patch``) is the public facade.
            if target.startswith("kforge.") and layer_of(target) > layer_of(me):
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert upward == []


@pytest.mark.parametrize("forbidden", ["textual", "kforge_tui"])
def test_kforge_never_imports_the_tui(forbidden):
    offenders = [f"{path.relative_to(ROOT)}:{line}" for path in sources("kforge")
                 for line, target in imports(path) if target.split(".")[0] == forbidden]
    assert offenders == []


def test_the_tui_never_imports_torch():
    offenders = [f"{path.relative_to(ROOT)}:{line}" for path in sources("kforge_tui")
                 for line, target in imports(path) if target.split(".")[0] == "torch"]
    assert offenders == []
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, kforge_tui.app; print('torch' in sys.modules)"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "False", "importing kforge_tui.app brings in torch"


def test_the_contract_sees_upward_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from ..engine.engine import Engine\n"
                     "import kforge.cli.main\n")
    found = [t for _, t in imports(probe, "kforge.core.probe") if t.startswith("kforge.")]
    assert found == ["kforge.engine.engine", "kforge.cli.main"] or set(found) >= {
        "kforge.engine.engine", "kforge.cli.main"}
    assert all(layer_of(t) > layer_of("kforge.core.probe") for t in found)


def test_no_public_class_name_means_two_things():
    # One name, one thing: a reader (or a grep) never has to ask which Decision or Backend.
    # Classes private to their module (a leading underscore) may repeat.
    where: dict[str, list[str]] = {}
    for path in sorted((ROOT / "kforge").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
