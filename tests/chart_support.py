"""Helpers for the chart tests: run the pinned helm, render the chart, find rendered objects."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from devcluster import Cluster
from devcluster.cluster import bin_dir
from tests.prom_support import free_port

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "pdpair"
CRDS = ROOT / "crds"
OPERATOR = str(Path(sys.executable).parent / "pdpair-operator")


def helm_path() -> str:
    """The helm that hack/build-k8s.sh builds (pinned in hack/versions.env)."""
    path = bin_dir() / "helm"
    assert os.access(path, os.X_OK), f"no helm at {path}: run hack/build-k8s.sh"
    return str(path)


def helm(*args: str, check: bool = True, timeout: float = 120, env: dict[str, str] | None = None,
         ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm_path(), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc


def set_args(values: dict[str, str] | None) -> list[str]:
    return [f"--set={k}={v}" for k, v in (values or {}).items()]


def template(values: dict[str, str] | None = None, *extra: str, namespace: str = "pdpair-system",
             release: str = "pdp") -> list[dict[str, Any]]:
    """``helm template`` output as objects (empty documents dropped)."""
    proc = helm("template", release, str(CHART), f"--namespace={namespace}", *set_args(values), *extra)
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def find(objects: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def crd_files() -> list[Path]:
    return sorted(CRDS.glob("*.yaml"))


def pdpair(name: str, namespace: str, example: str = "pure-kv-nixl.yaml") -> dict[str, Any]:
    """One of examples/ (no GPUs requested) renamed."""
    obj: dict[str, Any] = yaml.safe_load((ROOT / "examples" / example).read_text())
    obj["metadata"] = {"name": name, "namespace": namespace}
    return obj


def sa_kubeconfig(cluster: Cluster, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig holding only a TokenRequest token for ``account``: the API server authorizes
    every request by the chart's RBAC (no client certificate, no impersonation rights needed)."""
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
    config = yaml.safe_load(cluster.kubectl("config", "view", "--raw", "--minify", "--flatten").stdout)
    config["users"] = [{"name": account, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = account
    path.write_text(yaml.safe_dump(config))
    return path



class Operator:
    """``pdpair-operator`` as a local process, authenticated only by ``kubeconfig``."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path, *extra: str):
        self.log, self.metrics_port = log, free_port()
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [OPERATOR, f"--namespace={namespace}", *extra, "--standalone",
                 f"--metrics-port={self.metrics_port}", "--metrics-address=127.0.0.1", "--log-format=plain"],
                env={"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin", "HOME": str(log.parent),
                     **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
