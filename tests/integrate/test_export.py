"""`kforge export`: a standalone package with sources, launch plans, cubins per architecture
(NVRTC on the CPU), the prelude, a manifest and a README, importable without kforge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.errors import KforgeError
from kforge.integrate.export import export_session
from kforge.integrate.plan import read_plan
from kforge.runtime.nvrtc import PRELUDE, Compiler, compile_cubin
from tests.integrate.helpers import WINNING_OPS, make_session

pytest.importorskip("cuda.core", reason="NVRTC through cuda.core is not installed")

ELF = b"\x7fELF"


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    """One in-memory NVRTC cache for the module (each test has its own cache folder)."""
    return Compiler()


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> tuple[Path, int]:
    db = tmp_path_factory.mktemp("export") / "k.db"
    return db, make_session(db)


def test_the_package_has_every_part_and_cubins_for_each_arch(session, compiler, tmp_path):
    db, sid = session
    plan = read_plan(db, sid)
    result = export_session(plan, tmp_path, archs=["sm_90", "sm_121"], compiler=compiler)
    root = tmp_path / f"kforge_session_{sid}"
    assert result.path == root and result.kernels == 3 and result.problems == []
    assert {p.name for p in root.iterdir()} == {
        "__init__.py", "runtime", "prelude.cuh", "manifest.json", "README.md", "kernels"}
    assert (root / "prelude.cuh").read_text() == PRELUDE
    assert {p.name for p in (root / "runtime").iterdir()} == {
        "__init__.py", "argspec.py", "cache.py", "cubin.py", "cubin_elf.py", "describe.py",
        "errors.py", "guard.py", "launch_plan.py", "laws.py", "native.py", "native_guard.cpp",
        "nvrtc.py", "opcard.py", "plan.py", "ranges.py", "schema.py", "table.py"}
    for module in (root / "runtime").iterdir():
        imports = [ln for ln in module.read_text().splitlines() if ln.lstrip().startswith("from ")]
        assert not [ln for ln in imports if "kforge" in ln], module.name
    assert "from .argspec import " in (root / "runtime" / "table.py").read_text()
    assert "from .launch_plan import " in (root / "runtime" / "plan.py").read_text()
    winners = {d.card.key: d.candidate for d in plan.winners}
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["session"] == sid and manifest["archs"] == ["sm_90", "sm_121"]
    assert manifest["verified_on"] == {"name": "Fake GPU", "arch": "sm_90"}
    assert {k["op"] for k in manifest["kernels"]} == set(WINNING_OPS)
    for kernel in manifest["kernels"]:
        folder = root / kernel["dir"]
        assert kernel["speedup"] == WINNING_OPS[kernel["op"]]
        assert (folder / "kernel.cu").read_text().count('extern "C"') >= 1
        assert {p.name for p in folder.iterdir()} == {"kernel.cu", "plan.json", "sm_90.cubin",
                                                      "sm_121.cubin"}
        assert json.loads((folder / "plan.json").read_text()) == winners[kernel["key"]].plan
        assert kernel["cubins"] == {"sm_90": "sm_90.cubin", "sm_121": "sm_121.cubin"}
        for cubin in kernel["cubins"].values():
            assert (folder / cubin).read_bytes()[:4] == ELF
    reasons = {e["op"]: e["reason"] for e in manifest["eager"]}
    assert reasons["aten.addmm.default"] == "not searched yet"
    assert reasons["aten.view.default"] == "not a target (view/copy)"
    assert manifest["projected_speedup"] == pytest.approx(plan.projected)
    readme = (root / "README.md").read_text()
    assert f"import kforge_session_{sid}" in readme and f"kforge_session_{sid}.patch()" in readme
    assert "| `#" in readme and "not searched yet" in readme
    assert "`plan.json`" in readme and "launcher" not in readme
    assert not list(tmp_path.glob(".*tmp"))  # the staging folder is gone


def test_the_package_imports_without_kforge_and_needs_a_gpu_to_patch(session, compiler,
                                                                     tmp_path):
    db, sid = session
    export_session(read_plan(db, sid), tmp_path, name="toy_kernels", compiler=compiler)
    code = ("import sys; sys.modules['kforge'] = None\n"
            "import json, torch\n"
            "import toy_kernels\n"
            "from toy_kernels.runtime.argspec import freeze\n"
            "from toy_kernels.runtime.plan import PlanRunner, resolve_for\n"
            "assert 'kforge' not in {m.split('.')[0] for m in sys.modules if sys.modules[m]}\n"
            "assert freeze([1, 1.0, True]) != freeze([1, 1, 1])\n"
            "print(toy_kernels.manifest()['session'], len(toy_kernels.manifest()['kernels']))\n"
            "for k in toy_kernels.manifest()['kernels']:\n"
            "    plan = json.loads((toy_kernels.HERE / k['dir'] / 'plan.json').read_text())\n"
            "    resolved = resolve_for(plan, k['op'], k['args'], k['kwargs'])\n"
            "    PlanRunner(resolved, k['op'], None, torch.device('cpu'))\n"
            "    print(k['op'], len(resolved.launches))\n"
            "for bad in ['../..', '/etc', 'kernels/../../x', 'runtime']:\n"  # out of kernels/
            "    try:\n"
            "        print('loaded', toy_kernels.kernel_folder({**k, 'dir': bad}))\n"
            "    except ValueError:\n"
            "        print('refused')\n"
            "if not torch.cuda.is_available():\n"
            "    try:\n"
            "        toy_kernels.patch()\n"
            "    except RuntimeError as exc:\n"
            "        print(exc)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{sid} 3"
    resolved = dict(line.split() for line in lines[1:4])  # every plan resolves for its variant
    assert set(resolved) == set(WINNING_OPS) and all(int(n) >= 1 for n in resolved.values())
    assert lines[4:8] == ["refused"] * 4  # a manifest pointing outside the package
    if len(lines) > 8:
        assert lines[8] == "patch() needs a CUDA GPU and this torch sees none"


def test_an_empty_session_has_nothing_to_export(tmp_path):
    db = tmp_path / "k.db"
    sid = make_session(db, winners={})
    with pytest.raises(KforgeError, match=f"session {sid} has nothing to export"):
        export_session(read_plan(db, sid), tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_an_existing_package_is_replaced_only_with_force(session, compiler, tmp_path):
    db, sid = session
    plan = read_plan(db, sid)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mine.txt").write_text("keep")
    with pytest.raises(KforgeError, match="already exists"):
        export_session(plan, tmp_path, name="pkg")
    assert (tmp_path / "pkg" / "mine.txt").exists()
    export_session(plan, tmp_path, name="pkg", force=True, compiler=compiler)
    assert not (tmp_path / "pkg" / "mine.txt").exists()
    assert (tmp_path / "pkg" / "manifest.json").exists()


def test_a_link_named_like_the_package_is_replaced_never_followed(session, compiler, tmp_path):
    db, sid = session
    plan = read_plan(db, sid)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "mine.txt").write_text("keep")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "pkg").symlink_to(elsewhere)
    with pytest.raises(KforgeError, match="already exists"):
        export_session(plan, tmp_path / "out", name="pkg", compiler=compiler)
    export_session(plan, tmp_path / "out", name="pkg", force=True, compiler=compiler)
    assert not (tmp_path / "out" / "pkg").is_symlink()
    assert (tmp_path / "out" / "pkg" / "manifest.json").exists()
    assert [p.name for p in elsewhere.iterdir()] == ["mine.txt"]


class _Planting(Compiler):
    """A compiler that, as the first kernel compiles, plants links where the package's next
    files go in the staging folder, as someone who can write the export folder would: a link to
    a file of the user's, and a folder link to a folder of the user's."""

    def __init__(self, staged_in: Path, victim: Path) -> None:
        super().__init__()
        self.staged_in, self.victim, self.modes = staged_in, victim, []

    def compile(self, source, arch, options=None):
        for staging in self.staged_in.glob(".pkg.*"):
            self.modes.append(staging.stat().st_mode & 0o777)
            for folder in (staging / "kernels").iterdir():
                (folder / f"{arch}.cubin").symlink_to(self.victim / "mine.txt")
            (staging / "manifest.json").symlink_to(self.victim / "mine.txt")
        return super().compile(source, arch, options)


def test_a_link_planted_in_the_staging_folder_is_never_written_through(session, tmp_path):
    db, sid = session
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "mine.txt").write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    planting = _Planting(out, victim)
    with pytest.raises(KforgeError, match="sm_90.cubin is there already: kforge writes"):
        export_session(read_plan(db, sid), out, name="pkg", compiler=planting)
    assert planting.modes == [0o700]  # nobody else may enter the staging folder
    assert (victim / "mine.txt").read_text() == "keep"
    assert list(out.iterdir()) == []  # nothing left behind


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"archs": ["90"]}, "not a GPU architecture"),
    ({"name": "my-kernels"}, "cannot be a Python package name"),
    ({"name": "class"}, "cannot be a Python package name"),
    ({"name": "os"}, "is the name of a module Python or kforge imports"),
    ({"name": "kforge"}, "is the name of a module Python or kforge imports"),
])
def test_bad_names_are_refused(session, compiler, tmp_path, kwargs, message):
    db, sid = session
    with pytest.raises(KforgeError, match=message):
        export_session(read_plan(db, sid), tmp_path, compiler=compiler, **kwargs)


def test_the_packages_own_nvrtc_path_compiles_for_an_arch_it_has_no_cubin_for(session, tmp_path):
    """What patch(any_arch=True) does on a GPU the export did not cover, here without a GPU."""
    db, sid = session
    winner = read_plan(db, sid).winners[0]
    cubin = compile_cubin(winner.candidate.source, "sm_100", PRELUDE, ["-lineinfo"])
    assert cubin[:4] == ELF
    with pytest.raises(RuntimeError, match="NVRTC could not compile it for sm_100"):
        compile_cubin("this is not CUDA", "sm_100", PRELUDE)
    with pytest.raises(ValueError, match="not allowed"):
        compile_cubin(winner.candidate.source, "sm_100", PRELUDE, ["-G"])


def test_a_region_kernel_is_named_and_left_out(session, compiler, tmp_path):
    import dataclasses

    db, sid = session
    plan = read_plan(db, sid)
    first = plan.winners[0]
    region = dataclasses.replace(first, card=first.card.with_(region={
        "nodes": [], "inputs": [], "outputs": [], "members": []}))
    plan = dataclasses.replace(plan, decisions=[region if d is first else d
                                                for d in plan.decisions])
    result = export_session(plan, tmp_path, compiler=compiler)
    assert result.kernels == 2
    assert len(result.problems) == 1 and "fusion region's kernel runs through kforge" in \
        result.problems[0]
    manifest = json.loads((result.path / "manifest.json").read_text())
    assert first.card.key not in {k["key"] for k in manifest["kernels"]}


@pytest.mark.parametrize("key", ["../../escaped", "/tmp/kforge-escaped", "..", "a/b", "a\\b",
                                 "a/../../b", "k\x00ey", "a" * 65, "k\n", "ké"])
def test_a_crafted_card_key_writes_nothing_outside_the_package(session, compiler, tmp_path,
                                                                key):
    import dataclasses

    db, sid = session
    plan = read_plan(db, sid)
    first = plan.winners[0]
    crafted = dataclasses.replace(first, card=first.card.with_(key=key))
    plan = dataclasses.replace(plan, decisions=[crafted if d is first else d
                                                for d in plan.decisions])
    out = tmp_path / "a" / "b" / "out"
    with pytest.raises(KforgeError, match="cannot name a folder"):
        export_session(plan, out, compiler=compiler)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written == [] and not Path("/tmp/kforge-escaped").exists()

