"""The Helm chart, offline: helm lint, rendering, the CRD kept identical to crds/, the values schema,
least-privilege RBAC exactly as the operator and agents need it, dashboards ConfigMaps, and the
NetworkPolicy. Validation against the real API server's schemas is in tests/e2e/test_chart_install.py."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from dashboards import build
from tests.chart_support import CHART, crd_files, find, helm, template

GROUP = "pdpair.io"
OPERATOR_RULES = {
    (GROUP, "pdpairs"): {"get", "list", "watch", "patch"},
    (GROUP, "pdpairs/status"): {"get", "patch"},
    (GROUP, "pdpairs/finalizers"): {"update"},
    ("", "pods"): {"create", "delete", "get", "list", "watch", "patch"},
    ("", "services"): {"create", "delete", "get", "list", "watch", "patch"},
    ("", "configmaps"): {"create", "delete", "get", "list", "watch", "patch"},
    ("resource.k8s.io", "resourceclaimtemplates"): {"create", "delete", "list", "watch"},
    ("", "secrets"): {"create", "list", "watch"},
    ("networking.k8s.io", "networkpolicies"): {"create", "delete", "list", "watch", "patch"},
    ("rbac.authorization.k8s.io", "clusterroles"): {"bind"},
    ("", "events"): {"create", "patch"},
    ("apps", "deployments"): {"create", "delete", "list", "watch", "patch"},
    ("policy", "poddisruptionbudgets"): {"create", "delete", "list", "watch", "patch"},
    ("", "serviceaccounts"): {"create", "delete", "list", "watch", "patch"},
    ("rbac.authorization.k8s.io", "roles"): {"create", "delete", "list", "watch", "patch"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"create", "delete", "list", "watch", "patch"},
}
KOPF_CLUSTER_RULES = {("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
                      ("", "namespaces"): {"list", "watch"}}
AGENT_RULES = {("", "pods"): {"get"}, ("", "pods/status"): {"get", "patch"}}
VARIANTS = {
    "default": {},
    "all-namespaces": {"operator.allNamespaces": "true"},
    "everything-on": {"metrics.serviceMonitor.enabled": "true", "metrics.podMonitor.enabled": "true",
                      "networkPolicy.enabled": "true", "networkPolicy.pdpairs": "{demo}",
                      "networkPolicy.apiServerCIDRs": "{10.0.0.1/32}"},
}


def _values(variant: str) -> dict[str, str]:
    return VARIANTS[variant]


def rules(role: dict) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_lint_is_clean(variant: str) -> None:
    sets = [f"--set={k}={v}" for k, v in _values(variant).items()]
    proc = helm("lint", "--strict", str(CHART), *sets)
    assert "0 chart(s) failed" in proc.stdout and "[WARNING]" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_object_is_labelled_and_uniquely_named(variant: str) -> None:
    objects = template(_values(variant))
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), keys
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "pdp", obj["metadata"]


def test_chart_crds_are_byte_identical_to_crds_dir() -> None:
    source = {p.name: p.read_bytes() for p in crd_files()}
    chart = {p.name: p.read_bytes() for p in sorted((CHART / "files" / "crds").glob("*.yaml"))}
    assert source, "crds/ holds the PDPair CRD (source of truth)"
    assert chart == source, "files/crds/ must copy crds/: cp crds/*.yaml charts/pdpair/files/crds/"


def test_rendered_crd_equals_source_apart_from_labels_and_keep_policy() -> None:
    rendered = find(template(), "CustomResourceDefinition")
    source = [yaml.safe_load(p.read_text()) for p in crd_files()]
    assert len(rendered) == len(source)
    for crd in rendered:
        meta = crd["metadata"]
        assert meta["annotations"]["helm.sh/resource-policy"] == "keep"
        original = next(s for s in source if s["metadata"]["name"] == meta["name"])
        assert {k: v for k, v in crd.items() if k != "metadata"} == {
            k: v for k, v in original.items() if k != "metadata"}
    no_keep = find(template({"crds.keep": "false"}), "CustomResourceDefinition")
    assert all("helm.sh/resource-policy" not in c["metadata"].get("annotations", {}) for c in no_keep)
    assert not find(template({"crds.install": "false"}), "CustomResourceDefinition")


def test_operator_rbac_is_exactly_what_the_operator_uses() -> None:
    objects = template()
    (role,) = find(objects, "Role", "pdp-pdpair-operator")
    assert role["metadata"]["namespace"] == "pdpair-system"
    assert rules(role) == OPERATOR_RULES
    (cluster,) = find(objects, "ClusterRole", "pdp-pdpair-operator-cluster")
    assert rules(cluster) == KOPF_CLUSTER_RULES
    assert not any(o["kind"] == "ClusterRole" and "kopfpeerings" in json.dumps(o) for o in objects)
    (binding,) = find(objects, "RoleBinding", "pdp-pdpair-operator")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pdp-pdpair-operator",
                                    "namespace": "pdpair-system"}]


def test_all_namespaces_uses_a_cluster_role() -> None:
    objects = template(_values("all-namespaces"))
    assert not find(objects, "Role", "pdp-pdpair-operator")
    (role,) = find(objects, "ClusterRole", "pdp-pdpair-operator")
    assert rules(role) == OPERATOR_RULES
    (cluster,) = find(objects, "ClusterRole", "pdp-pdpair-operator-cluster")
    assert rules(cluster) == KOPF_CLUSTER_RULES
    (deploy,) = find(objects, "Deployment")
    assert "--all-namespaces" in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert rules(find(objects, "ClusterRole", "pdp-pdpair-agent")[0]) == AGENT_RULES


def test_agent_role_only_reads_pods_and_patches_pod_status() -> None:
    """One ClusterRole that the operator binds each PDPair's agent ServiceAccount to, and may bind
    (``bind`` on it by name) without holding its rights; no agent ServiceAccount in the chart."""
    objects = template()
    (role,) = find(objects, "ClusterRole", "pdp-pdpair-agent")
    assert rules(role) == AGENT_RULES
    (operator,) = find(objects, "Role", "pdp-pdpair-operator")
    (bind,) = [r for r in operator["rules"] if r["verbs"] == ["bind"]]
    assert bind["resources"] == ["clusterroles"] and bind["resourceNames"] == ["pdp-pdpair-agent"]
    assert [s["metadata"]["name"] for s in find(objects, "ServiceAccount")] == ["pdp-pdpair-operator"]
    assert not find(objects, "RoleBinding", "pdp-pdpair-agent")


def test_operator_deployment_is_single_standalone_and_non_root() -> None:
    (deploy,) = find(template(), "Deployment")
    spec = deploy["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "pdp-pdpair-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532
    (container,) = pod["containers"]
    assert container["args"] == ["--namespace=pdpair-system", "--standalone",
                                 "--agent-cluster-role=pdp-pdpair-agent", "--metrics-port=8080",
                                 "--metrics-address=$(POD_IP)", "--liveness=http://$(POD_IP):8081/healthz",
                                 "--log-format=json", '--metrics-scraper={"namespaceSelector":{},'
                                 '"podSelector":{"matchLabels":{"app.kubernetes.io/name":"prometheus"}}}']
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    (svc,) = find(template(), "Service")
    assert svc["spec"]["selector"] == spec["selector"]["matchLabels"]


def test_dashboards_are_configmaps_for_the_grafana_sidecar() -> None:
    maps = find(template(), "ConfigMap")
    assert len(maps) == len(build.DASHBOARDS)
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((name, text),) = cm["data"].items()
        assert json.loads(text) == json.loads((CHART / "dashboards" / name).read_text())
    assert not find(template({"dashboards.enabled": "false"}), "ConfigMap")


def test_committed_dashboards_are_up_to_date() -> None:
    assert build.main(["--check"]) == 0, "run: .venv/bin/python -m dashboards.build"


def test_monitors_and_network_policy_render_when_enabled() -> None:
    objects = template(_values("everything-on"))
    (sm,) = find(objects, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    (pm,) = find(objects, "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"]["pdpair.io/child"] == "pod"
    (np,) = (o for o in find(objects, "NetworkPolicy") if o["metadata"]["name"] != "pdp-pdpair-operator")
    assert np["spec"]["podSelector"]["matchLabels"]["pdpair.io/name"] == "demo"
    peers = {"podSelector": {"matchLabels": {"pdpair.io/name": "demo"}}}
    assert np["spec"]["policyTypes"] == ["Egress"] and "ingress" not in np["spec"]
    assert peers in np["spec"]["egress"][0]["to"]
    assert {"ipBlock": {"cidr": "10.0.0.1/32"}} in np["spec"]["egress"][2]["to"]
    assert [o["metadata"]["name"] for o in find(template(), "NetworkPolicy")] == ["pdp-pdpair-operator"]
    assert not find(template(), "ServiceMonitor")


def test_operator_network_policy_admits_only_the_scraper_to_the_metrics_port() -> None:
    (np,) = find(template(), "NetworkPolicy")
    assert np["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert np["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = np["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8080, "protocol": "TCP"}]
    assert rule["from"] == [{"namespaceSelector": {},
                             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    assert not find(template({"networkPolicy.operator": "false"}), "NetworkPolicy")


@pytest.mark.parametrize("bad", [
    ["--set=operator.logFormat=xml"],
    ["--set=operator.metricsPort=70000"],
    ["--set=operator.watchNamespace=Not_A_Namespace"],
    ["--set=unknownKey=1"],
    ["--set=operator.image.pullPolicy=Sometimes"],
    ["--set=networkPolicy.enabled=true"],
    ["--set=metrics.serviceMonitor.interval=soon"],
])
def test_values_schema_rejects_bad_values(bad: list[str]) -> None:
    proc = helm("template", "pdp", str(CHART), *bad, check=False)
    assert proc.returncode != 0 and "schema" in proc.stderr.lower(), proc.stderr


def test_schema_covers_every_default_value() -> None:
    """Every key of values.yaml is declared (the schema forbids unknown keys, so a missed one breaks)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict, sch: dict, path: str) -> None:
        for key, value in node.items():
            assert key in sch.get("properties", {}), f"{path}{key} missing from values.schema.json"
            child = sch["properties"][key]
            if isinstance(value, dict) and "properties" in child:
                walk(value, child, f"{path}{key}.")
    walk(values, schema, "")


def test_templates_need_no_cluster() -> None:
    """``helm template`` must not call the API server (no lookup): CI renders it before any cluster."""
    proc = subprocess.run(["grep", "-rn", "lookup", str(CHART / "templates")], capture_output=True, text=True)
    assert proc.stdout == ""
