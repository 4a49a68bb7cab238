"""The compiled copy of the package (dataplane/compiled), built for real with mypyc: every listed module
is an extension there, agents started with PDPAIR_COMPILED=on run it and say so, and their rooms arrive
verified. scripts/test then runs the agents' integration tests once more on it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from dataplane import compiled
from dataplane.harness.agent_processes import run_pair
from dataplane.harness.bench.cases import mix_config

pytestmark = [pytest.mark.nixl, pytest.mark.slow]


@pytest.fixture(scope="module")
def copy() -> Path:
    return compiled.build()


def test_the_copy_keeps_the_native_posters_library(copy: Path) -> None:
    """Built once per checkout (scripts/setup): an agent of the copy must not rebuild it at start-up."""
    native = compiled.PACKAGE / "transports" / "nixl" / "native" / "_build"
    libs = sorted(p.name for p in native.glob("libpdpair_nixl_poster-*.so"))
    assert libs, "scripts/setup builds the native poster"
    assert sorted(p.name for p in (copy / "dataplane/transports/nixl/native/_build").glob("*.so")) == libs


def test_every_listed_module_is_an_extension_in_the_copy(copy: Path) -> None:
    names = [m.removesuffix(".py").replace("/", ".") for m in compiled.MODULES]
    probe = (
        "import importlib, importlib.machinery, sys\n"
        f"names = {names!r}\n"
        "suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)\n"
        "for n in names:\n"
        "    f = importlib.import_module(n).__file__\n"
        "    assert f.endswith(suffixes) and f.startswith(sys.argv[1]), (n, f)\n"
        "import dataplane.compiled as c\n"
        "print(c.active())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(copy)}
    run = subprocess.run(
        [sys.executable, "-P", "-c", probe, str(copy)], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "True"


@pytest.mark.parametrize("wanted", ["on", "off"])
def test_agents_run_what_was_asked_and_deliver_every_byte(
    copy: Path, wanted: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(compiled.ENV, wanted)
    cfg = mix_config("qwen3-next", 24, inflight=4)
    cfg = msgspec.structs.replace(cfg, synthetic=msgspec.structs.replace(cfg.synthetic, verify=True))
    st = run_pair(cfg, timeout=120)
    assert st["compiled"] is (wanted == "on")
    assert st["requests"]["succeeded"] == 24 and st["requests"]["verification_failures"] == 0
    for name, comp in st["components"].items():
        assert comp["verified_bytes"] == comp["bytes"] > 0, name
