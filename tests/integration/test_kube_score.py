"""kube-score (pinned in hack/versions.env, built by hack/build-kube-score.sh) on what a user's cluster
would hold: the Helm chart's manifests (``helm template``) beside every example PDPair's children as
the operator renders them (its planner on an empty cluster). Every finding below OK must be one that
docs/operator.md ("kube-score") lists with its reason, and every listed one must still be found: a new
finding, or a fixed one left in the docs, fails."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from pdpair_operator.observe import owner_from_body
from pdpair_operator.planner import Observed, plan

from tests.chart_support import ROOT, template

NAMESPACE = "pdpair-system"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
GRADES = {1: "CRITICAL", 5: "WARNING", 7: "ALMOST-OK"}
"""kube-score's grades below OK (10)."""
RENDERS = {
    "default": {},
    "opt-in": {"networkPolicy.enabled": "true",
               "networkPolicy.pdpairs": "{" + ",".join(yaml.safe_load(p.read_text())["metadata"]["name"]
                                                      for p in EXAMPLES) + "}",
               "metrics.serviceMonitor.enabled": "true", "metrics.podMonitor.enabled": "true"},
}
"""The chart with its defaults, and with every opt-in object (agent egress policies, ServiceMonitor,
PodMonitor)."""


def _versions() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (ROOT / "hack" / "versions.env").read_text().splitlines()
             if "=" in line and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def kube_score() -> Path:
    version = _versions()["KUBE_SCORE_VERSION"]
    path = Path.home() / ".cache" / "pdpair" / "kube-score" / version / "kube-score"
    assert path.is_file(), f"no kube-score at {path}: run hack/build-kube-score.sh"
    return path


def example_children(path: Path) -> list[dict[str, Any]]:
    """What the operator creates for one example on an empty cluster (its own plan, render path)."""
    body = yaml.safe_load(path.read_text())
    body["metadata"].update(namespace=NAMESPACE, uid=f"uid-{path.stem}", generation=1)
    result = plan(owner_from_body(body), Observed(), datetime(2025, 1, 1, tzinfo=UTC),
                  new_key=lambda: bytes(32))
    assert result.creates, f"{path.name}: the operator plans no children (status {result.status})"
    return list(result.creates)


Finding = tuple[str, str, str]
"""(check id, object: ``Kind`` or ``Kind container``, grade)."""


def findings(manifests: list[dict[str, Any]], tmp_path: Path) -> set[Finding]:
    source = tmp_path / "manifests.yaml"
    source.write_text(yaml.safe_dump_all(manifests))
    k8s = re.match(r"v\d+\.\d+", _versions()["KUBERNETES_VERSION"])
    assert k8s is not None
    proc = subprocess.run(
        [str(kube_score()), "score", f"--kubernetes-version={k8s.group()}", "--output-format=json",
         str(source)], capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), f"kube-score failed ({proc.returncode}): {proc.stderr}"
    found: set[Finding] = set()
    for obj in json.loads(proc.stdout):
        for check in obj["checks"]:
            grade = GRADES.get(check["grade"])
            if check["skipped"] or check["grade"] >= 10:
                continue
            assert grade is not None, f"kube-score grade {check['grade']} in {check}"
            for comment in check["comments"] or [{"path": ""}]:
                where = " ".join(filter(None, (obj["type_meta"]["kind"], comment["path"])))
                found.add((check["check"]["id"], where, grade))
    return found


_ROW = re.compile(r"^\| `([a-z0-9-]+)` \| ([A-Za-z]+(?: `[a-z0-9-]+`)?) \| (CRITICAL|WARNING|ALMOST-OK) \| "
                  r"([a-z, -]+) \|")


def documented() -> dict[str, set[Finding]]:
    """The findings docs/operator.md explains, per render (``default``, ``opt-in``)."""
    text = (ROOT / "docs" / "operator.md").read_text()
    section = text.split("\n## kube-score\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[Finding]] = {name: set() for name in RENDERS}
    for line in section.splitlines():
        row = _ROW.match(line)
        if row is None:
            continue
        check, where, grade, renders = row.groups()
        for render in (r.strip() for r in renders.split(",")):
            assert render in out, f"docs/operator.md kube-score row names render {render!r}: {line}"
            out[render].add((check, where.replace("`", ""), grade))
    assert any(out.values()), "docs/operator.md has no kube-score table rows"
    return out


@pytest.mark.parametrize("render", sorted(RENDERS))
def test_kube_score_finds_only_what_the_docs_explain(render: str, tmp_path: Path) -> None:
    manifests = template(RENDERS[render], namespace=NAMESPACE)
    for path in EXAMPLES:
        manifests += example_children(path)
    assert sum(1 for m in manifests if m["kind"] == "Pod") >= 2 * len(EXAMPLES)
    found, expected = findings(manifests, tmp_path), documented()[render]
    assert not found - expected, f"findings not explained in docs/operator.md: {sorted(found - expected)}"
    assert not expected - found, f"docs/operator.md explains findings kube-score no longer reports: " \
                                 f"{sorted(expected - found)}"


def test_every_rendered_container_has_cpu_and_memory_requests_and_limits() -> None:
    """The pods are Guaranteed: every container's CPU and memory requests equal its limits."""
    for path in EXAMPLES:
        for pod in (m for m in example_children(path) if m["kind"] == "Pod"):
            for container in pod["spec"]["containers"]:
                res = container.get("resources", {})
                where = f"{path.name}: {pod['metadata']['name']} {container['name']}"
                for key in ("cpu", "memory"):
                    assert res.get("requests", {}).get(key), f"{where}: no {key} request"
                    assert res["requests"][key] == res.get("limits", {}).get(key), where
