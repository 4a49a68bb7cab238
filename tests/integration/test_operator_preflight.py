"""``pdpair-operator``'s start-up check against a real API server: it passes with the cluster's
kubeconfig, and credentials the server rejects are one line, not kopf retrying forever."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devcluster import Cluster

pytestmark = [pytest.mark.cluster]
ROOT = Path(__file__).resolve().parents[2]


def _env(kubeconfig: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    paths = [str(ROOT), str(ROOT / "operator"), env.get("PYTHONPATH", "")]
    return {**env, "KUBECONFIG": str(kubeconfig), "HOME": str(home), "PYTHONPATH": os.pathsep.join(paths)}


def test_check_passes_against_the_clusters_api_server(cluster: Cluster, tmp_path: Path) -> None:
    code = "from pdpair_operator.preflight import check_api_server; print(check_api_server(20))"
    proc = subprocess.run([sys.executable, "-c", code], env=_env(cluster.kubeconfig, tmp_path),
                          capture_output=True, text=True, timeout=60)
    server = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    assert proc.returncode == 0 and proc.stdout.strip() == server.rstrip("/"), proc.stderr


def test_rejected_credentials_are_one_line(cluster: Cluster, tmp_path: Path) -> None:
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    name = admin["clusters"][0]["name"]
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "bogus",
        "clusters": admin["clusters"],
        "users": [{"name": "bogus", "user": {"token": "not-a-token-the-server-knows"}}],
        "contexts": [{"name": "bogus", "context": {"cluster": name, "user": "bogus"}}],
    }
    kubeconfig = tmp_path / "bogus.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "pdpair_operator.cli", "--connect-timeout", "20"],
                          env=_env(kubeconfig, tmp_path), capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert "rejected the kubeconfig's credentials (401 Unauthorized)" in lines[0]
