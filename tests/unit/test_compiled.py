"""The compiled copy's bookkeeping (dataplane/compiled): what names a copy, which copy an agent gets, and
the clear refusals. Building and running it: tests/integration/test_compiled_agents.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dataplane import compiled
from dataplane.compiled import CompileUnavailable

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def package(tmp_path: Path) -> Path:
    copy = tmp_path / "src" / "dataplane"
    shutil.copytree(compiled.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "_build"))
    return copy


def test_every_listed_module_exists_and_is_checked_by_mypy() -> None:
    for module in compiled.MODULES:
        assert (ROOT / module).is_file(), module
    assert len(set(compiled.MODULES)) == len(compiled.MODULES)


def test_an_edited_source_names_a_new_copy(package: Path) -> None:
    before = compiled.digest(package)
    assert compiled.digest(package) == before
    (package / "__pycache__").mkdir(exist_ok=True)
    (package / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"ignored")
    assert compiled.digest(package) == before
    target = package / "room" / "lifecycle.py"
    target.write_text(target.read_text() + "\n# edited\n")
    assert compiled.digest(package) != before


def test_modes_and_where_agents_look(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, package: Path) -> None:
    monkeypatch.setenv("PDPAIR_COMPILED_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(compiled.ENV, "off")
    assert compiled.pythonpath() is None
    assert compiled.pythonpath("auto") is None  # nothing built in this cache: interpreted, no build
    assert compiled.built(package) is None
    root = compiled.location(package)
    (root / "dataplane").mkdir(parents=True)
    assert compiled.built(package) is None  # a copy is only used once its build completed
    (root / ".complete").write_text("x\n")
    assert compiled.built(package) == root
    monkeypatch.setenv(compiled.ENV, "sometimes")
    with pytest.raises(CompileUnavailable, match="PDPAIR_COMPILED='sometimes'"):
        compiled.mode()
    with pytest.raises(CompileUnavailable, match="expected one of auto, on, off"):
        compiled.choose("always")


def test_no_compiler_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = compiled.sysconfig.get_config_var
    monkeypatch.setattr(
        compiled.sysconfig, "get_config_var", lambda name: "/nonexistent/cc" if name == "CC" else real(name)
    )
    with pytest.raises(CompileUnavailable, match=r"no C compiler \(/nonexistent/cc\)"):
        compiled._mypyc(tmp_path)


def test_in_place_refuses_a_checkout_and_a_folder_without_the_package(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "dataplane.compiled", "--in-place"], cwd=ROOT, capture_output=True, text=True,
        timeout=60,
    )
    assert run.returncode == 1 and "is a checkout" in run.stderr
    assert not list((ROOT / "dataplane" / "agent").glob("*.so"))
    with pytest.raises(CompileUnavailable, match="no dataplane package"):
        compiled.build_in_place(tmp_path)


def test_a_package_compiled_in_place_is_what_its_children_run(
    package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image's package (compiled --in-place): the launchers report its children compiled without
    putting a cached copy on their path; a checkout's (no extension beside the sources) is unchanged."""
    monkeypatch.setattr(compiled, "PACKAGE", package)
    monkeypatch.setenv(compiled.ENV, "off")
    cmd, env = [sys.executable, "-m", "dataplane.cli"], {"PYTHONPATH": "/x"}
    assert not compiled.in_place(package) and not compiled.child(cmd, env)
    suffix = next(s for s in compiled.importlib.machinery.EXTENSION_SUFFIXES if s != ".so")
    (package / "agent" / f"roles{suffix}").write_bytes(b"")
    assert compiled.in_place(package) and compiled.child(cmd, env)
    assert cmd == [sys.executable, "-m", "dataplane.cli"] and env == {"PYTHONPATH": "/x"}


def test_old_copies_are_pruned_newest_kept(tmp_path: Path) -> None:
    for i in range(6):
        d = tmp_path / f"pdpair-{i:016x}"
        d.mkdir()
        os.utime(d, (1000 + i, 1000 + i))
    (tmp_path / ".building-x").mkdir()  # a build under way is not a copy
    compiled.prune(tmp_path, keep=4)
    kept = [f"pdpair-{i:016x}" for i in range(2, 6)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".building-x", *kept]


def test_no_compiled_slice_bound_calls_anything_but_len() -> None:
    """mypyc 2.4.1 evaluates a slice's bound twice when the sliced object is not one of its own sequence
    types (a memoryview, ``Any``): ``data[sock.send(data):]`` sent every frame twice (found in the
    local API's write loop). A bound in a compiled module is a name, a constant or arithmetic on them
    and ``len``."""
    import ast

    found = []
    for module in compiled.MODULES:
        for node in ast.walk(ast.parse((ROOT / module).read_text())):
            if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice)):
                continue
            for bound in (node.slice.lower, node.slice.upper, node.slice.step):
                calls = [c for c in ast.walk(bound) if isinstance(c, ast.Call)] if bound is not None else []
                if any(not (isinstance(c.func, ast.Name) and c.func.id == "len") for c in calls):
                    found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found
