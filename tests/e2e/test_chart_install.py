"""The chart on the real control plane: every rendered object accepted by the API server's own schemas
(server-side dry run, strict field validation); install, upgrade and uninstall leaving no orphans; and
the operator reconciling a PDPair as the chart's ServiceAccount (a TokenRequest token, so only the
chart's RBAC applies) — and failing once one rule is removed, which shows the test can fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dataplane.harness.waiting import wait_for
from devcluster import Cluster
from tests.chart_support import (
    CHART,
    ROOT,
    Operator,
    find,
    helm,
    pdpair,
    sa_kubeconfig,
    set_args,
    template,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

INSTANCE = "app.kubernetes.io/instance"
SUITE = ROOT / "tests" / "e2e" / "test_operator_e2e.py"
DERIVED = {"replicaset", "pod", "endpoints", "endpointslice"}
"""Made by controllers from the chart's Deployment and Service, carrying their labels."""
NOT_FOR_DRY_RUN = {"ServiceMonitor", "PodMonitor"}
"""prometheus-operator kinds: their CRDs are not part of this cluster."""


def _uid() -> str:
    return uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
def helm_env(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("helm")
    return {"KUBECONFIG": str(cluster.kubeconfig), "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}


def _namespace(cluster: Cluster, name: str) -> str:
    cluster.kubectl("create", "namespace", name)
    return name


def _install(env: dict[str, str], release: str, namespace: str, values: dict[str, str] | None = None,
             verb: str = "install") -> None:
    helm(verb, release, str(CHART), f"--namespace={namespace}", "--take-ownership", "--timeout=120s",
         *set_args(values), env=env, timeout=180)


def leftovers(cluster: Cluster, release: str) -> list[str]:
    """Every object of any listable kind, in any namespace, still labelled with the release."""
    kinds = cluster.kubectl("api-resources", "--verbs=list", "-o", "name").stdout.split()
    kinds = [k for k in kinds if k not in ("events", "events.events.k8s.io", "componentstatuses")]
    proc = cluster.kubectl("get", ",".join(kinds), "-A", "-l", f"{INSTANCE}={release}", "-o", "name",
                           check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.split() if line]


# ---- validation against the real API server ---------------------------------------------------

@pytest.mark.parametrize("values", [
    {}, {"operator.allNamespaces": "true"},
    {"networkPolicy.enabled": "true", "networkPolicy.pdpairs": "{demo}"},
], ids=["default", "all-namespaces", "network-policy"])
def test_server_side_dry_run_accepts_every_object(cluster: Cluster, values: dict[str, str]) -> None:
    ns = _namespace(cluster, f"chart-dry-{_uid()}")
    objects = [o for o in template(values, namespace=ns) if o["kind"] not in NOT_FOR_DRY_RUN]
    proc = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-",
                           input=yaml.safe_dump_all(objects), check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(server dry run)") == len(objects), proc.stdout


def test_server_side_dry_run_rejects_an_unknown_field(cluster: Cluster) -> None:
    """The validation above can fail: a misspelt field in the Deployment is refused."""
    ns = _namespace(cluster, f"chart-dry-{_uid()}")
    (deploy,) = find(template(namespace=ns), "Deployment")
    deploy["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    proc = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-",
                           input=yaml.safe_dump(deploy), check=False)
    assert proc.returncode != 0 and "imagePullPolcy" in proc.stderr, proc.stderr


# ---- install, upgrade, uninstall --------------------------------------------------------------

def test_install_upgrade_uninstall_leave_no_orphans(cluster: Cluster, helm_env: dict[str, str]) -> None:
    release, uid = f"pdp-{_uid()}", _uid()
    ns = _namespace(cluster, f"chart-{uid}")
    _install(helm_env, release, ns)
    kinds = {name.split("/")[0].split(".")[0] for name in leftovers(cluster, release)}
    expected = {o["kind"].lower() for o in template(namespace=ns, release=release)}
    assert expected <= kinds and kinds - expected <= DERIVED, kinds

    wide = {"operator.allNamespaces": "true", "crds.keep": "false"}
    _install(helm_env, release, ns, wide, verb="upgrade")
    after = set(leftovers(cluster, release))
    assert f"role.rbac.authorization.k8s.io/{release}-pdpair-operator" not in after, "old Role orphaned"
    assert f"clusterrole.rbac.authorization.k8s.io/{release}-pdpair-operator" in after
    assert f"clusterrole.rbac.authorization.k8s.io/{release}-pdpair-agent" in after
    crd = cluster.kubectl_json("get", "crd", "pdpairs.pdpair.io")
    assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {}), "CRD not upgraded"

    _install(helm_env, release, ns, {"operator.allNamespaces": "false"}, verb="upgrade")
    after = set(leftovers(cluster, release))
    assert not [n for n in after if "clusterrole.rbac.authorization.k8s.io/" in n and n.endswith("-operator")]

    helm("uninstall", release, f"--namespace={ns}", "--timeout=120s", env=helm_env, timeout=180)
    crd_only = ["customresourcedefinition.apiextensions.k8s.io/pdpairs.pdpair.io"]
    remaining = wait_for("uninstall to leave only the kept CRD",
                         lambda: (r := leftovers(cluster, release)) == crd_only and r, timeout=90)
    assert remaining == crd_only
    crd = cluster.kubectl_json("get", "crd", "pdpairs.pdpair.io")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    secrets = cluster.kubectl_json("get", "secrets", "-n", ns, "-l", f"owner=helm,name={release}")
    assert secrets["items"] == [], "helm release records left behind"


# ---- the operator under the chart's RBAC -------------------------------------------------------

@pytest.fixture
def chart_release(cluster: Cluster, helm_env: dict[str, str]) -> Iterator[tuple[str, str]]:
    release, ns = f"pdp-{_uid()}", f"chart-rbac-{_uid()}"
    _namespace(cluster, ns)
    _install(helm_env, release, ns)
    yield release, ns
    cluster.kubectl("delete", "pdpairs", "--all", "-n", ns, "--wait=false", check=False)
    helm("uninstall", release, f"--namespace={ns}", "--timeout=120s", env=helm_env, check=False, timeout=180)


def _children(cluster: Cluster, ns: str, name: str) -> dict[str, int]:
    objs = cluster.kubectl_json("get", "pods,services,configmaps", "-n", ns, "-l", f"pdpair.io/name={name}")
    counts: dict[str, int] = {}
    for obj in objs["items"]:
        counts[obj["kind"]] = counts.get(obj["kind"], 0) + 1
    return counts


def _run_operator(cluster: Cluster, tmp_path: Path, release: str, ns: str, name: str,
                  done: Callable[[], Any], timeout: float) -> tuple[Operator, Any]:
    kubeconfig = sa_kubeconfig(cluster, ns, f"{release}-pdpair-operator", tmp_path / "sa.kubeconfig")
    operator = Operator(kubeconfig, ns, tmp_path / "operator.log",
                        f"--agent-cluster-role={release}-pdpair-agent")
    try:
        cluster.apply([pdpair(name, ns)])
        try:
            return operator, wait_for(f"PDPair {name} reconciled", done, timeout=timeout)
        except AssertionError:
            return operator, None
    finally:
        operator.stop()


def test_operator_reconciles_as_the_chart_service_account(
        cluster: Cluster, chart_release: tuple[str, str], tmp_path: Path) -> None:
    release, ns = chart_release
    account = f"system:serviceaccount:{ns}:{release}-pdpair-operator"
    assert cluster.kubectl("auth", "can-i", "create", "pods", "-n", ns, f"--as={account}",
                           check=False).stdout.strip() == "yes"
    for verb in ("get", "update", "patch", "delete"):
        assert cluster.kubectl("auth", "can-i", verb, "secrets", "-n", ns, f"--as={account}",
                               check=False).stdout.strip() == "no", f"the operator must not {verb} secrets"

    def reconciled() -> Any:
        status = cluster.kubectl_json("get", "pdpair", "demo", "-n", ns).get("status", {})
        kids = _children(cluster, ns, "demo")
        return status.get("conditions") and kids.get("Pod", 0) >= 2 and kids.get("Service", 0) >= 1 \
            and kids.get("ConfigMap", 0) >= 1 and (status, kids)

    operator, result = _run_operator(cluster, tmp_path, release, ns, "demo", reconciled, timeout=90)
    log = operator.output()
    assert result, f"not reconciled under the chart's RBAC; operator log:\n{log[-4000:]}"
    assert "forbidden" not in log.lower(), log[-4000:]
    pods = cluster.kubectl_json("get", "pods", "-n", ns, "-l", "pdpair.io/name=demo")["items"]
    assert {p["spec"].get("serviceAccountName") for p in pods} == {"demo-agent"}
    binding = cluster.kubectl_json("get", "rolebinding", "demo-agent", "-n", ns)
    assert binding["roleRef"]["name"] == f"{release}-pdpair-agent", binding


def test_removing_one_rule_breaks_reconciliation(
        cluster: Cluster, chart_release: tuple[str, str], tmp_path: Path) -> None:
    """Drop ``services`` from the operator's Role: the same run must now fail to build the PDPair."""
    release, ns = chart_release
    role = cluster.kubectl_json("get", "role", f"{release}-pdpair-operator", "-n", ns)
    index = next(i for i, r in enumerate(role["rules"]) if "services" in r["resources"])
    rule = role["rules"][index]
    patched = [{"op": "replace", "path": f"/rules/{index}/resources",
                "value": [r for r in rule["resources"] if r != "services"]}]
    cluster.kubectl("patch", "role", f"{release}-pdpair-operator", "-n", ns, "--type=json",
                    f"--patch={json.dumps(patched)}")

    def services() -> int:
        return _children(cluster, ns, "broken").get("Service", 0)

    def refused() -> bool:
        return operator_log.exists() and "services is forbidden" in operator_log.read_text(errors="replace")

    refused_at: list[float] = []

    def refused_then_waited() -> bool:
        """Refused, and then given 10 s more in which the operator might still have built the PDPair."""
        if refused() and not refused_at:
            refused_at.append(time.monotonic())
        return bool(refused_at) and time.monotonic() - refused_at[0] > 10

    operator_log = tmp_path / "operator.log"
    operator, _ = _run_operator(cluster, tmp_path, release, ns, "broken", refused_then_waited, timeout=90)
    assert refused(), f"no RBAC refusal for services; operator log:\n{operator.output()[-4000:]}"
    assert services() == 0, "Services were created without the services rule"
    kids = _children(cluster, ns, "broken")
    status = cluster.kubectl_json("get", "pdpair", "broken", "-n", ns).get("status", {})
    assert not (kids.get("Pod") and kids.get("ConfigMap") and status.get("conditions")), (kids, status)


# ---- the operator's own end-to-end suite under the chart's RBAC -----------------------------------

def run_suite(cluster: Cluster, kubeconfig: Path, agent_role: str, basetemp: Path, *args: str,
              ) -> subprocess.CompletedProcess[str]:
    """tests/e2e/test_operator_e2e.py on this cluster, its operator authenticated by ``kubeconfig`` and
    binding the agents to ``agent_role`` (the release's)."""
    env = {**os.environ, "PDPAIR_TEST_KUBECONFIG": str(cluster.kubeconfig),
           "PDPAIR_OPERATOR_KUBECONFIG": str(kubeconfig), "PDPAIR_OPERATOR_AGENT_ROLE": agent_role}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={basetemp}", *args]
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)


def rbac_denials(basetemp: Path) -> list[str]:
    """Lines of the suite's operator logs where the API server refused the operator by RBAC."""
    return [line[:300] for log in basetemp.rglob("operator.log")
            for line in log.read_text(errors="replace").splitlines()
            if "is forbidden: User" in line and " cannot " in line]


@pytest.fixture
def cluster_wide_release(cluster: Cluster, helm_env: dict[str, str], tmp_path: Path,
                         ) -> Iterator[tuple[str, Path]]:
    release, ns = f"pdp-{_uid()}", _namespace(cluster, f"chart-suite-{_uid()}")
    _install(helm_env, release, ns, {"operator.allNamespaces": "true"})
    yield release, sa_kubeconfig(cluster, ns, f"{release}-pdpair-operator", tmp_path / "sa.kubeconfig")
    helm("uninstall", release, f"--namespace={ns}", "--timeout=120s", env=helm_env, check=False, timeout=180)


def test_operator_e2e_suite_passes_under_the_chart_rbac(
        cluster: Cluster, cluster_wide_release: tuple[str, Path], tmp_path: Path) -> None:
    """The whole suite passes with the operator authenticated as the chart's ServiceAccount, and not one
    RBAC refusal appears in any of its operator logs."""
    release, kubeconfig = cluster_wide_release
    proc = run_suite(cluster, kubeconfig, f"{release}-pdpair-agent", tmp_path / "run1", str(SUITE))
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert not rbac_denials(tmp_path), rbac_denials(tmp_path)[:5]


def test_operator_e2e_fails_without_the_pods_rule(
        cluster: Cluster, cluster_wide_release: tuple[str, Path], tmp_path: Path) -> None:
    """The suite can fail: with ``pods`` dropped from the ClusterRole, creating an example's pods fails."""
    release, kubeconfig = cluster_wide_release
    role = f"{release}-pdpair-operator"
    rules = cluster.kubectl_json("get", "clusterrole", role)["rules"]
    index = next(i for i, r in enumerate(rules) if r["resources"] == ["pods"])
    cluster.kubectl("patch", "clusterrole", role, "--type=json",
                    f"--patch={json.dumps([{'op': 'remove', 'path': f'/rules/{index}'}])}")
    proc = run_suite(cluster, kubeconfig, f"{release}-pdpair-agent", tmp_path / "run", str(SUITE), "-x",
                     "-k", "test_example_creates_owned_children_and_pods_run")
    assert proc.returncode == 1 and "1 failed" in proc.stdout, proc.stdout[-6000:]
    assert any('cannot list resource "pods"' in line for line in rbac_denials(tmp_path))
