"""The agent's per-room modules compiled with mypyc: the same typed Python, built as C extensions.

Why: with rooms of a few KiB, the role workers' Python is what bounds the agent — ~20 steps of a few µs
each, no single one worth a rewrite (docs/benchmarks.md, sessions 13 to 15). mypyc compiles the modules
those steps live in from their type annotations (the ones mypy already checks in CI), so the whole
room path runs as C without a second implementation to keep in step. The rest of the package (set-up,
HTTP, the local API's client and workers, the engines' adapters other than NIXL's) stays interpreted.

How it is used. Two ways, one list (``MODULES``):

- **A compiled copy** of the package, for agents (and engines) started from a checkout
  (``AgentProcess``, ``EngineProcess``: the demo, the benchmarks, the tests): every source file of
  ``dataplane/`` copied, the modules of ``MODULES`` compiled beside them, in a folder named for the
  hash of the sources, mypy's version and the interpreter's ABI — an edited source is a new folder,
  never a stale extension. ``PDPAIR_COMPILED`` says whether the launchers put that folder first on a
  child's ``PYTHONPATH``: ``auto`` (default) when it is already built, ``on`` building it first (~1 min
  on two cores; an error if it cannot), ``off`` never. Build it with ``python -P -m dataplane.compiled``.
- **In place** (``--in-place``), for images: the installed package's modules are compiled where they
  are, so ``pdpair-agent`` in a pod always runs them (the Dockerfile does this).

Compiled classes are native: their attributes are the declared ones, their methods cannot be
replaced at run time, and annotations are checked at run time (a wrong type is a ``TypeError``); so
instrumentation that patches methods (``bench/room_trace.py``) runs the interpreted modules. The
folder: ``$PDPAIR_COMPILED_DIR``, else ``~/.cache/pdpair/compiled``.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ENV = "PDPAIR_COMPILED"
MODES = ("auto", "on", "off")
PACKAGE = Path(__file__).resolve().parents[1]
"""The ``dataplane`` package these sources belong to."""

MODULES = (
    "dataplane/agent/control_sockets.py",
    "dataplane/agent/decode.py",
    "dataplane/agent/lanes.py",
    "dataplane/agent/metrics.py",
    "dataplane/agent/pools.py",
    "dataplane/agent/prefill.py",
    "dataplane/agent/requests.py",
    "dataplane/agent/roles.py",
    "dataplane/agent/sources.py",
    "dataplane/agent/stats.py",
    "dataplane/codec/frames.py",
    "dataplane/codec/kinds.py",
    "dataplane/codec/ints.py",
    "dataplane/codec/metadata.py",
    "dataplane/codec/status.py",
    "dataplane/localapi/client.py",
    "dataplane/localapi/link.py",
    "dataplane/localapi/server.py",
    "dataplane/localapi/sources.py",
    "dataplane/localapi/stream.py",
    "dataplane/planner/assemble.py",
    "dataplane/planner/request.py",
    "dataplane/planner/shape.py",
    "dataplane/synthetic_engine/process.py",
    "dataplane/transports/base.py",
    "dataplane/transports/blocks.py",
    "dataplane/transports/nixl/adapter.py",
    "dataplane/transports/nixl/descriptors.py",
)
"""The room path: the role workers and what they call per room, the local API's both sides (the
sidecar's workers, the client an engine embeds) and the synthetic engine that drives it in the demo and
the benchmarks. Classes that interpreted code subclasses (the other transports' adapters, tests) carry
``@mypyc_attr(allow_interpreted_subclasses=True)``. Not here: modules defining msgspec Structs (mypyc
drops their class keywords, e.g. ``tag``; the sglang messages' Structs live in ``codec/messages.py`` so
that their codecs compile; the local API's in ``localapi/messages.py``), ``planner/plan.py``
(``WritePlan.trusted`` makes instances without ``__init__``), ``room/`` (its records and rooms are
generic dataclasses, which mypyc's native classes cannot be). mypyc 2.4.1 evaluates a slice bound twice
on a memoryview or ``Any``, so slice bounds in these modules call nothing but ``len``
(``tests/unit/test_compiled.py`` checks)."""

MYPY_CONFIG = (
    "[mypy]\nignore_missing_imports = True\ncheck_untyped_defs = True\n"
    "[mypy-torch.*,cupy.*,triton.*,numba.*,nixl.*,nixl_cu12.*,nixl_cu13.*,mori.*]\nfollow_imports = skip\n"
)
"""The engines' and GPU libraries' own types are not followed: the room path calls them as ``Any`` (their
annotations cost minutes to analyse where torch is installed, and typing them adds no speed)."""
BUILD_TIMEOUT = 1800.0
KEEP = 4
"""Compiled copies kept in the cache (~5 MB each)."""


class CompileUnavailable(Exception):
    """The compiled modules cannot be built here; the message says why."""


def mode() -> str:
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise CompileUnavailable(f"{ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


def digest(package: Path = PACKAGE) -> str:
    """What a compiled copy depends on: every source file of the package, the module list, mypy's
    version, the interpreter's extension ABI."""
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        h.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    h.update("\n".join(MODULES).encode())
    h.update(_mypy_version().encode())
    h.update(str(sysconfig.get_config_var("SOABI")).encode())
    return h.hexdigest()[:16]


def _mypy_version() -> str:
    try:
        return importlib.metadata.version("mypy")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def cache_dir() -> Path:
    env = os.environ.get("PDPAIR_COMPILED_DIR")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "pdpair" / "compiled"


def location(package: Path = PACKAGE) -> Path:
    """Where the compiled copy of these sources is (or would be): a folder holding ``dataplane/``."""
    return cache_dir() / f"pdpair-{digest(package)}"


def _complete(root: Path) -> Path | None:
    return root if (root / ".complete").is_file() else None


def built(package: Path = PACKAGE) -> Path | None:
    return _complete(location(package))


EXTENSIONS = tuple(f"*{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES if suffix != ".so")
"""Python extension modules (a package compiled in place) are not copied; other libraries are — the
native poster's (``transports/nixl/native/_build``), which an agent would otherwise rebuild at start-up."""


def build(package: Path = PACKAGE) -> Path:
    """The compiled copy of these sources, built first if needed; raises ``CompileUnavailable``."""
    root = location(package)
    if _complete(root) is not None:
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".building-", dir=root.parent))
    try:
        skip = shutil.ignore_patterns("__pycache__", *EXTENSIONS)
        shutil.copytree(package, work / "dataplane", ignore=skip)
        _mypyc(work)
        (work / ".complete").write_text(root.name + "\n")
        try:
            work.rename(root)
        except OSError:
            if _complete(root) is None:  # not a concurrent build that got there first
                raise
        prune(root.parent, keep=KEEP)
        return root
    finally:
        shutil.rmtree(work, ignore_errors=True)


def prune(folder: Path, keep: int) -> None:
    """Keep the ``keep`` newest copies (a checkout being edited makes a new one per build)."""
    copies = sorted(folder.glob("pdpair-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in copies[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def build_in_place(site: Path) -> None:
    """Compile ``MODULES`` of the package installed under ``site`` where they are (images).

    mypyc runs on a copy of the package alone, then its extensions (the modules' and the shared
    ``*__mypyc`` library beside the package) are copied into ``site``: run in ``site`` itself, mypy would
    take every installed top-level module there (``typing_extensions``) for one of the project's own."""
    if not (site / "dataplane" / "__init__.py").is_file():
        raise CompileUnavailable(f"no dataplane package under {site}")
    work = Path(tempfile.mkdtemp(prefix="pdpair-mypyc-"))
    try:
        shutil.copytree(site / "dataplane", work / "dataplane",
                        ignore=shutil.ignore_patterns("__pycache__", *EXTENSIONS))
        _mypyc(work)
        built = sorted({path for pattern in EXTENSIONS for path in work.rglob(pattern)})
        if not built:
            raise CompileUnavailable("mypyc built no extension")
        for path in built:
            shutil.copy2(path, site / path.relative_to(work))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _mypyc(root: Path) -> None:
    """Run mypyc on ``MODULES`` below ``root`` (extensions land beside their sources)."""
    compiler = sysconfig.get_config_var("CC") or "cc"
    if shutil.which(str(compiler).split()[0]) is None:
        raise CompileUnavailable(f"no C compiler ({compiler}) to build the compiled modules")
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not include.is_file():
        raise CompileUnavailable(f"no Python headers ({include}) to build the compiled modules")
    config = root / ".pdpair-mypyc.ini"
    config.write_text(MYPY_CONFIG)
    env = {k: v for k, v in os.environ.items() if k != ENV}
    cmd = [sys.executable, "-m", "mypyc", "--config-file", config.name, *MODULES]
    try:
        run = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CompileUnavailable(f"mypyc: {exc}") from exc
    finally:
        config.unlink(missing_ok=True)
        shutil.rmtree(root / "build", ignore_errors=True)
        shutil.rmtree(root / ".mypy_cache", ignore_errors=True)
    if run.returncode != 0:
        tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-20:])
        raise CompileUnavailable(f"mypyc failed ({run.returncode}):\n{tail}")


def active() -> bool:
    """Whether this process runs the compiled room path (its role workers' module is an extension)."""
    module = sys.modules.get("dataplane.agent.roles")
    file = str(getattr(module, "__file__", "") or "")
    return file.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def pythonpath(wanted: str | None = None) -> Path | None:
    """The folder to put first on an agent's ``PYTHONPATH`` for ``wanted`` (default: ``PDPAIR_COMPILED``);
    None: run the interpreted modules."""
    wanted = wanted or mode()
    if wanted == "off":
        return None
    if wanted == "auto":
        return built()
    return build()


def in_place(package: Path = PACKAGE) -> bool:
    """Whether ``package`` itself is compiled (an image's, ``--in-place``): Python imports an extension
    before the source beside it, so every process that imports the package runs the compiled modules."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    return any((package / "agent" / f"roles{suffix}").is_file() for suffix in suffixes)


def child(cmd: list[str], env: dict[str, str]) -> bool:
    """Make ``cmd`` (``[python, ...]``) and its ``env`` run the compiled copy when ``PDPAIR_COMPILED``
    wants it: the copy first on ``PYTHONPATH``, and ``-P`` so that the working directory (a checkout's
    own ``dataplane/``) does not come before it. Whether it will (always from a package compiled in place)."""
    if in_place(PACKAGE):
        return True
    root = pythonpath()
    if root is None:
        return False
    cmd.insert(1, "-P")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    return True


def choose(wanted: str) -> bool:
    """For a command that starts agents (the benchmarks): the agents it starts run ``wanted`` (``on``:
    built first); whether they run compiled. Raises ``CompileUnavailable`` for ``on`` where it cannot."""
    if wanted not in MODES:
        raise CompileUnavailable(f"compiled: {wanted!r}, expected one of {', '.join(MODES)}")
    path = pythonpath(wanted)
    os.environ[ENV] = wanted
    return path is not None


__all__ = [
    "ENV", "MODULES", "CompileUnavailable", "active", "build", "build_in_place", "built", "child", "choose",
    "in_place", "pythonpath",
]
