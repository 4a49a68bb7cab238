"""The operator end to end on the real control plane (devcluster: kube-apiserver, controller-manager for
garbage collection, scheduler, kwok nodes): CRD validation, children with owner references, scaling,
pod replacement, coordinated rollouts, status from the agents' reports, cascade deletion, restarts.

Where no real agent runs, the test plays the agents (``FakeAgents``: each Running pod reports
``pdpair.io/TransferReady`` as ``PodStatusReporter`` would). ``test_real_agents_handshake`` runs the
real ``pdpair-agent run`` processes through ``devcluster.PodRunner``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_support import (
    EXAMPLES,
    FakeAgents,
    condition,
    get,
    pdpair,
    pdpair_yaml,
    pods,
    publish_bootstrap_addresses,
    running_operator,
)
from pdpair_operator.status import CONDITION_TYPES

from dataplane.harness.waiting import wait_for
from devcluster import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def apply(cluster: Cluster, ns: str, text: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "-n", ns, "-f", "-", input=text, check=check)


def running(cluster: Cluster, ns: str, name: str, expect: int) -> list[dict[str, Any]] | None:
    items = [p for p in pods(cluster, ns, name) if not p["metadata"].get("deletionTimestamp")]
    ok = len(items) == expect and all(p.get("status", {}).get("phase") == "Running" for p in items)
    return items if ok else None


def ready(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    obj = pdpair(cluster, ns, name)
    return obj if condition(obj, "Ready").get("status") == "True" else None


def children(cluster: Cluster, ns: str, name: str) -> dict[str, list[dict[str, Any]]]:
    sel = f"pdpair.io/name={name}"
    return {kind: get(cluster, kind, ns, "-l", sel)["items"] for kind in ("pods", "services", "configmaps")}


# ---- the CRD ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("patch", "message"), [
    ({"prefill": {"tensorParallelSize": 3}}, "tensorParallelSize must be a power of two"),
    ({"decode": {"replicas": 1, "dataParallelSize": 3}}, "dataParallelSize must be a power of two"),
    ({"decode": {"replicas": 1, "tensorParallelSize": 2, "dataParallelSize": 4}},
     "tensorParallelSize must be divisible by dataParallelSize"),
    ({"prefill": {"replicas": 1, "tensorParallelSize": 2, "dataParallelSize": 2}},
     "prefill.dataParallelSize must be 1"),
    ({"model": {"name": "m", "profile": "pure-kv", "kvItemLen": 4,
                "components": [{"name": "c", "stateType": "swa", "itemLens": [4], "numItems": 2}]}},
     "set exactly one of model.profile or model.components"),
    ({"prefill": {"replicas": 0}, "decode": {"replicas": 2}}, "scaled to zero together"),
    ({"transfer": {"backend": "nixl", "mori": {"qpPerTransfer": 2}}},
     "only valid with transfer.backend 'mori'"),
    ({"transfer": {"backend": "tcp"}}, "Unsupported value"),
    ({"engine": {"mode": "sidecar"}, "transfer": {"backend": "nixl", "device": "cuda"},
      "prefill": {"replicas": 1}},
     "prefill: a sidecar engine with transfer.device cuda needs resources.gpuAllocation 'dra'"),
    ({"decode": {"replicas": 1, "resources": {"gpuDeviceClassName": "gpu.nvidia.com"}}},
     "resources.gpuDeviceClassName is only valid with resources.gpuAllocation 'dra'"),
    ({"engine": {"mode": "sidecar", "resources": {"hugePages": "1Gi"}}},
     "engine.resources.hugePages needs engine.resources.cpu or memory"),
    ({"engine": {"resources": {"memory": "1Gi"}}}, "engine.resources applies to a sidecar engine"),
    ({"decode": {"resources": {"memory": "lots"}}},
     "resources.memory must be a non-negative Kubernetes quantity, for example 64Gi"),
    ({"prefill": {"resources": {"cpu": "-1"}}}, "resources.cpu must be a non-negative Kubernetes quantity"),
    ({"prefill": {"resources": {"cpu": "4", "cpuLimit": "3500m"}}},
     "resources.cpuLimit must be at least resources.cpu (its request)"),
    ({"engine": {"mode": "sidecar", "resources": {"memory": "2Gi", "memoryLimit": "1Gi"}}},
     "engine.resources.memoryLimit must be at least engine.resources.memory (its request)"),
])
def test_invalid_pdpair_is_rejected_with_the_cel_message(cluster: Cluster, ns: str, patch: dict[str, Any],
                                                         message: str) -> None:
    doc = yaml.safe_load(pdpair_yaml("bad", 1, 1))
    doc["spec"].update(patch)
    proc = apply(cluster, ns, yaml.safe_dump(doc), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_immutable_fields_are_refused_on_update(cluster: Cluster, ns: str) -> None:
    apply(cluster, ns, pdpair_yaml("imm", 1, 1))
    doc = yaml.safe_load(pdpair_yaml("imm", 1, 1))
    doc["spec"]["model"]["name"] = "another/model"
    proc = apply(cluster, ns, yaml.safe_dump(doc), check=False)
    assert proc.returncode != 0 and "model.name is immutable" in proc.stderr


# ---- examples → children → running pods -----------------------------------------------------------
@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_example_creates_owned_children_and_pods_run(cluster: Cluster, ns: str, example: Path) -> None:
    doc = yaml.safe_load(example.read_text())
    name = doc["metadata"]["name"]
    cluster.kubectl("apply", "-n", ns, "-f", str(example))
    owner_uid = pdpair(cluster, ns, name)["metadata"]["uid"]
    total = doc["spec"]["prefill"]["replicas"] + doc["spec"]["decode"]["replicas"]

    def complete() -> dict[str, list[dict[str, Any]]] | None:
        kids = children(cluster, ns, name)
        counts = (len(kids["pods"]), len(kids["services"]), len(kids["configmaps"]))
        services = 4 if "sglang" in doc["spec"].get("engine", {}) else 3  # + the router's
        return kids if counts == (total, services, 1) else None

    kids = wait_for(f"children of {name}", complete, timeout=60)
    for obj in (o for group in kids.values() for o in group):
        [ref] = obj["metadata"]["ownerReferences"]
        assert (ref["uid"], ref["kind"], ref["controller"]) == (owner_uid, "PDPair", True)
    wait_for(f"{total} pods Running", lambda: running(cluster, ns, name, total), timeout=90)
    status = wait_for("status", lambda: pdpair(cluster, ns, name).get("status"), timeout=30)
    assert status["generationHash"] and status["bootstrapEndpoint"].endswith(f".{ns}.svc:8998")
    gpu = {doc["spec"][r].get("resources", {}).get("gpuResourceName", "nvidia.com/gpu")
           for r in ("prefill", "decode")}
    nodes = {p["spec"]["nodeName"] for p in pods(cluster, ns, name)}
    if gpu == {"amd.com/gpu"}:
        assert all(n.startswith("kwok-amd-node-") for n in nodes), nodes
    for pod in pods(cluster, ns, name):
        assert condition(pod, "pdpair.io/TransferReady") == {}, "only the agent may set TransferReady"
        claimed = doc["spec"][pod["metadata"]["labels"]["pdpair.io/role"]]["resources"].get("gpuAllocation")
        if claimed == "dra":
            [claim] = pod["status"]["resourceClaimStatuses"]
            allocated = get(cluster, "resourceclaim", ns, claim["resourceClaimName"])["status"]["allocation"]
            assert allocated["devices"]["results"], allocated


def test_fake_agents_make_it_ready_and_scale_up_and_down(cluster: Cluster, ns: str) -> None:
    apply(cluster, ns, pdpair_yaml("scale", 1, 1))
    with FakeAgents(cluster, ns, "scale"):
        obj = wait_for("Ready", lambda: ready(cluster, ns, "scale"), timeout=90)
        assert condition(obj, "TransferReady")["status"] == "True"
        assert obj["status"]["prefill"]["ready"] == "1/1"
        apply(cluster, ns, pdpair_yaml("scale", 3, 3))
        wait_for("6 pods", lambda: running(cluster, ns, "scale", 6), timeout=90)
        wait_for("Ready at 3+3", lambda: (o := ready(cluster, ns, "scale")) and
                 o["status"]["decode"]["ready"] == "3/3", timeout=90)
        apply(cluster, ns, pdpair_yaml("scale", 1, 2))
        left = wait_for("3 pods", lambda: running(cluster, ns, "scale", 3), timeout=90)
        labels = [p["metadata"]["labels"] for p in left]
        indices = sorted((lb["pdpair.io/role"], lb["pdpair.io/index"]) for lb in labels)
        assert indices == [("decode", "0"), ("decode", "1"), ("prefill", "0")]


def test_deleted_pod_is_replaced(cluster: Cluster, ns: str) -> None:
    apply(cluster, ns, pdpair_yaml("heal", 1, 1))
    before = wait_for("2 pods", lambda: running(cluster, ns, "heal", 2), timeout=90)
    victim = before[0]["metadata"]
    cluster.kubectl("delete", "pod", victim["name"], "-n", ns, "--wait=true")

    def replaced() -> bool:
        now = running(cluster, ns, "heal", 2) or []
        metas = [p["metadata"] for p in now]
        return any(m["name"] == victim["name"] and m["uid"] != victim["uid"] for m in metas)

    wait_for("replacement pod", replaced, timeout=90)


def test_coordinated_rollout_keeps_capacity_and_points_each_generation_at_its_own_prefill(
        cluster: Cluster, ns: str) -> None:
    """Capacity never drops mid-rollout, and each generation's decodes are configured with the bootstrap
    Service that selects only that generation's prefills. The agents play no part here (``FakeAgents``);
    that agents of two generations refuse to pair is shown with real agents by
    ``tests/integration/test_agent_two_process.py::test_generation_mismatch_refused``."""
    apply(cluster, ns, pdpair_yaml("roll", 2, 4))
    with FakeAgents(cluster, ns, "roll"):
        old = wait_for("Ready", lambda: ready(cluster, ns, "roll"), timeout=120)["status"]["generationHash"]
        apply(cluster, ns, pdpair_yaml("roll", 2, 4, image="ghcr.io/pdpair/agent:0.2.0"))
        seen: list[dict[str, dict[str, int]]] = []

        def finished() -> bool:
            items = [p for p in pods(cluster, ns, "roll") if not p["metadata"].get("deletionTimestamp")]
            snap: dict[str, dict[str, int]] = {}
            for p in items:
                labels = p["metadata"]["labels"]
                serving = condition(p, "Ready").get("status") == "True" and \
                    condition(p, "pdpair.io/TransferReady").get("reason") == "HandshakeComplete"
                key = f"{labels['pdpair.io/generation']}/{'serving' if serving else 'other'}"
                snap.setdefault(key, {"prefill": 0, "decode": 0})[labels["pdpair.io/role"]] += 1
            seen.append(snap)
            gens = {k.split("/")[0] for k in snap}
            obj = pdpair(cluster, ns, "roll")
            done = condition(obj, "Ready").get("status") == "True"
            return done and gens == {obj["status"]["generationHash"]}

        wait_for("rollout to finish", finished, timeout=180, interval=0.2)
    new = pdpair(cluster, ns, "roll")["status"]["generationHash"]
    assert new != old
    for snap in seen:
        serving = [v for k, v in snap.items() if k.endswith("/serving")]
        served = {r: sum(v[r] for v in serving) for r in ("prefill", "decode")}
        assert served["prefill"] >= 2 and served["decode"] >= 4, f"capacity dropped mid-rollout: {snap}"
    assert any(any(k.startswith(new) for k in s) and any(k.startswith(old) for k in s) for s in seen)
    cm = get(cluster, "configmap", ns, f"roll-agent-{new}")
    peer = yaml.safe_load(cm["data"]["decode.yaml"])["peer"]["bootstrapHost"]
    assert peer == f"roll-bootstrap-{new}.{ns}.svc"
    svc = get(cluster, "service", ns, f"roll-bootstrap-{new}")
    assert svc["spec"]["selector"]["pdpair.io/generation"] == new
    wait_for("old generation's children gone", lambda: not [
        o for group in children(cluster, ns, "roll").values() for o in group
        if o["metadata"].get("labels", {}).get("pdpair.io/generation") == old], timeout=60)
    reasons = {e["reason"] for e in get(cluster, "events", ns, "--field-selector",
                                         "involvedObject.name=roll")["items"]}
    assert {"RolloutStarted", "RolloutComplete"} <= reasons


def test_delete_cascades_through_the_garbage_collector(cluster: Cluster, ns: str) -> None:
    apply(cluster, ns, pdpair_yaml("gone", 2, 2))
    wait_for("children", lambda: len(children(cluster, ns, "gone")["pods"]) == 4, timeout=60)
    cluster.kubectl("delete", "pdpair", "gone", "-n", ns, "--wait=true", timeout=60)
    wait_for("everything gone", lambda: not any(children(cluster, ns, "gone").values()), timeout=90)


def test_operator_restart_mid_work_converges_without_duplicates(cluster: Cluster, ns: str,
                                                                tmp_path: Path) -> None:
    text = "---\n".join(pdpair_yaml(f"r{i}", 1, 2) for i in range(5))
    apply(cluster, ns, text)
    with running_operator(cluster, tmp_path / "second.log", "--namespace", ns):
        for i in range(5):
            wait_for(f"r{i} pods", lambda i=i: running(cluster, ns, f"r{i}", 3), timeout=120)
    for i in range(5):
        kids = children(cluster, ns, f"r{i}")
        assert (len(kids["pods"]), len(kids["services"]), len(kids["configmaps"])) == (3, 3, 1)
    stray = [p["metadata"]["name"] for p in get(cluster, "pods", ns)["items"]
             if not p["metadata"].get("ownerReferences")]
    assert stray == []


def test_status_and_printer_columns(cluster: Cluster, ns: str) -> None:
    apply(cluster, ns, pdpair_yaml("cols", 1, 1))
    with FakeAgents(cluster, ns, "cols"):
        wait_for("Ready", lambda: ready(cluster, ns, "cols"), timeout=90)
    out = cluster.kubectl("get", "pdp", "-n", ns).stdout
    header, row = out.splitlines()[:2]
    assert header.split()[:6] == ["NAME", "P", "READY", "D", "READY", "READY"]
    assert row.split()[:5] == ["cols", "1/1", "1/1", "True", "AllReplicasReady"]
    obj = pdpair(cluster, ns, "cols")
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    explain = cluster.kubectl("explain", "pdpair.spec.transfer.backend").stdout
    assert "mori" in explain and "nixl" in explain
    conditions = {c["type"]: c for c in obj["status"]["conditions"]}
    assert set(conditions) == set(CONDITION_TYPES), conditions
    for c in conditions.values():
        assert c["status"] in ("True", "False", "Unknown") and c["reason"] and c["lastTransitionTime"], c
    assert conditions["Ready"]["status"] == "True" and conditions["Degraded"]["status"] == "False"


# ---- GPUs through Dynamic Resource Allocation ---------------------------------------------------------
def test_dra_sidecar_pods_share_one_claim_the_scheduler_allocated(cluster: Cluster, ns: str) -> None:
    """``gpuAllocation: dra``: the real scheduler allocates each pod's claim from the kwok nodes' simulated
    ResourceSlices (devcluster/dra.py), and the engine and agent containers reference that one claim."""
    classes = cluster.kubectl("get", "deviceclass", "gpu.nvidia.com", check=False)
    assert classes.returncode == 0, (
        "no DeviceClass gpu.nvidia.com: this cluster publishes no DRA GPU inventory (devcluster does, "
        "docs/devcluster.md; restart a `make cluster-up` cluster older than that)")
    claimed = {"gpuAllocation": "dra"}
    apply(cluster, ns, pdpair_yaml(
        "dra", 1, 2, engine={"mode": "sidecar"}, transfer={"backend": "nixl", "device": "cuda"},
        prefill={"replicas": 1, "resources": {**claimed, "gpus": 2}},
        decode={"replicas": 2, "resources": claimed}))
    items = wait_for("3 DRA pods Running", lambda: running(cluster, ns, "dra", 3), timeout=120)
    owner_uid = pdpair(cluster, ns, "dra")["metadata"]["uid"]
    templates = get(cluster, "resourceclaimtemplates", ns, "-l", "pdpair.io/name=dra")["items"]
    assert sorted(t["metadata"]["labels"]["pdpair.io/role"] for t in templates) == ["decode", "prefill"]
    assert {t["metadata"]["ownerReferences"][0]["uid"] for t in templates} == {owner_uid}
    devices: set[tuple[str, str]] = set()
    for pod in items:
        [entry] = pod["spec"]["resourceClaims"]
        assert entry["resourceClaimTemplateName"].startswith("dra-gpus-")
        names = {c["name"]: c.get("resources", {}) for c in pod["spec"]["containers"]}
        assert set(names) == {"agent", "engine"}
        for resources in names.values():
            assert resources.get("claims") == [{"name": entry["name"]}], resources
            assert "nvidia.com/gpu" not in resources.get("limits", {})
        [claim_status] = pod["status"]["resourceClaimStatuses"]
        claim = get(cluster, "resourceclaim", ns, claim_status["resourceClaimName"])
        assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
        assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]
        results = claim["status"]["allocation"]["devices"]["results"]
        want = 2 if pod["metadata"]["labels"]["pdpair.io/role"] == "prefill" else 1
        assert len(results) == want, results
        assert {(r["driver"], r["pool"]) for r in results} == {("gpu.nvidia.com", pod["spec"]["nodeName"])}
        devices |= {(r["pool"], r["device"]) for r in results}
    assert len(devices) == 4, f"two pods were given one device: {devices}"
    with FakeAgents(cluster, ns, "dra"):
        wait_for("Ready", lambda: ready(cluster, ns, "dra"), timeout=90)


def test_engine_huge_pages_pass_the_api_servers_pod_validation(cluster: Cluster, ns: str) -> None:
    """``engine.resources.hugePages``: the API server accepts the rendered pods (huge pages need cpu or
    memory beside them, request = limit) and the engine container, alone, asks for them. Whether a
    node has them is the scheduler's business (the kwok nodes advertise none: the pods stay Pending)."""
    engine = {"mode": "sidecar", "resources": {"memory": "2Gi", "hugePages": "1Gi"}}
    apply(cluster, ns, pdpair_yaml("huge", 1, 1, engine=engine))
    def created() -> list[dict[str, Any]] | None:
        items = pods(cluster, ns, "huge")
        return items if len(items) == 2 else None

    items = wait_for("2 pods created", created, timeout=60)
    for pod in items:
        containers = {c["name"]: c.get("resources", {}) for c in pod["spec"]["containers"]}
        assert containers["engine"]["limits"]["hugepages-2Mi"] == "1Gi"
        requests = containers["engine"]["requests"]
        assert (requests["memory"], requests["hugepages-2Mi"]) == ("2Gi", "1Gi")
        assert "hugepages-2Mi" not in json.dumps(containers["agent"])


def test_dra_on_amd_nodes_uses_the_amd_device_class(cluster: Cluster, ns: str) -> None:
    """The vendor default: an amd.com/gpu role claims from gpu.amd.com, which only the AMD nodes publish."""
    amd = {"replicas": 1, "tensorParallelSize": 4,
           "resources": {"gpuAllocation": "dra", "gpuResourceName": "amd.com/gpu"},
           "tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    apply(cluster, ns, pdpair_yaml("amd", 1, 1, engine={"mode": "sidecar"},
                                   transfer={"backend": "nixl", "device": "cuda"}, prefill=amd, decode=amd))
    items = wait_for("2 AMD DRA pods Running", lambda: running(cluster, ns, "amd", 2), timeout=120)
    for pod in items:
        assert pod["spec"]["nodeName"].startswith("kwok-amd-node-"), pod["spec"]["nodeName"]
        [claim] = pod["status"]["resourceClaimStatuses"]
        results = get(cluster, "resourceclaim", ns, claim["resourceClaimName"])["status"]["allocation"]
        assert [r["driver"] for r in results["devices"]["results"]] == ["gpu.amd.com"] * 4


def test_unallocatable_claim_surfaces_the_schedulers_reason(cluster: Cluster, ns: str) -> None:
    """A claim from a DeviceClass nobody installed: the scheduler's own reason becomes the Ready reason."""
    missing = {"gpuAllocation": "dra", "gpuDeviceClassName": "gpu.example.com"}
    apply(cluster, ns, pdpair_yaml("nocls", 1, 1, prefill={"replicas": 1, "resources": {"gpus": 0}},
                                   decode={"replicas": 1, "resources": missing}))

    def unschedulable() -> dict[str, Any] | None:
        cond = condition(pdpair(cluster, ns, "nocls"), "Ready")
        return cond if cond.get("reason") == "PodsUnschedulable" else None

    cond = wait_for("Ready=False PodsUnschedulable", unschedulable, timeout=90)
    assert "device class gpu.example.com does not exist" in cond["message"], cond


# ---- real agents through the local pod runner ---------------------------------------------------------
def _agent_status(address: str, port: int = 9400) -> dict[str, Any]:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{address}:{port}/status", timeout=5) as resp:
        return dict(json.loads(resp.read()))


def _by_role(cluster: Cluster, ns: str, name: str, role: str) -> dict[str, Any]:
    return next(p for p in pods(cluster, ns, name) if p["metadata"]["labels"]["pdpair.io/role"] == role
                and not p["metadata"].get("deletionTimestamp"))


@contextmanager
def _real_agents(cluster: Cluster, ns: str, tmp_path: Path, manifest: str) -> Iterator[Any]:
    """The PDPair ``manifest`` applied and its pods' ``pdpair-agent`` run for real (``PodRunner``)."""
    import ipaddress
    import sys
    import threading

    from operator_support import REPO

    from devcluster import PodRunner

    hosts = tmp_path / "hosts.json"
    hosts.write_text("{}")
    shim = [sys.executable, str(Path(__file__).with_name("agent_shim.py")), str(hosts), "--",
            str(REPO / ".venv" / "bin" / "pdpair-agent")]
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=manifest)
    stop = threading.Event()
    with PodRunner(cluster, ns, {"pdpair-agent": shim}, selector="pdpair.io/name=pure-kv",
                   workdir=tmp_path / "pods") as runner:
        runner.watch(interval=0.3)

        def publish() -> None:
            while not stop.wait(0.3):
                try:
                    publish_bootstrap_addresses(cluster, runner, ns, hosts)
                except Exception as exc:  # a busy API server or a pod mid-start: the next round retries
                    print(f"publishing bootstrap addresses: {exc}", file=sys.stderr)

        threading.Thread(target=publish, daemon=True).start()
        try:
            yield runner
        finally:
            stop.set()
            for pod in list(runner.pods.values()):
                assert ipaddress.ip_address(pod.address).is_loopback, pod.address


def test_real_agents_handshake_then_refuse_an_incompatible_schema(cluster: Cluster, ns: str,
                                                                  tmp_path: Path) -> None:
    manifest = (EXAMPLES / "pure-kv-nixl.yaml").read_text()
    with _real_agents(cluster, ns, tmp_path, manifest) as runner:
        _handshake_and_transfer(cluster, runner, ns)
        _incompatible_decode_is_refused(cluster, runner, ns)


def test_real_agents_serve_every_rank_of_tp_2_pods(cluster: Cluster, ns: str, tmp_path: Path) -> None:
    """One agent per pod serves each rank: prefill TP 2 and decode TP 2 pods pair rank by rank, the
    pods turn ready only once every rank has, and the canary moves bytes on both decode ranks."""
    doc = yaml.safe_load((EXAMPLES / "pure-kv-nixl.yaml").read_text())
    for role in ("prefill", "decode"):
        doc["spec"][role]["tensorParallelSize"] = 2
    with _real_agents(cluster, ns, tmp_path, yaml.safe_dump(doc)) as runner:
        _handshake_and_transfer(cluster, runner, ns)
        decode = runner.address(_by_role(cluster, ns, "pure-kv", "decode")["metadata"]["name"])
        ranks = _agent_status(decode)["ranks"]
        assert sorted(ranks) == ["0", "1"] and all(r["ready"] for r in ranks.values()), ranks


def _handshake_and_transfer(cluster: Cluster, runner: Any, ns: str) -> None:
    """Real agents: the PDPair turns Ready from their own pod conditions, and the canary moves bytes."""
    obj = wait_for("Ready via real agents", lambda: ready(cluster, ns, "pure-kv"), timeout=120)
    transfer = condition(obj, "TransferReady")
    assert (transfer["status"], transfer["reason"]) == ("True", "Paired"), transfer
    for role in ("prefill", "decode"):
        pod = _by_role(cluster, ns, "pure-kv", role)
        reported = condition(pod, "pdpair.io/TransferReady")
        assert (reported["status"], reported["reason"]) == ("True", "Paired"), reported
    decode = runner.address(_by_role(cluster, ns, "pure-kv", "decode")["metadata"]["name"])

    def verified() -> dict[str, Any] | None:
        status = _agent_status(decode)
        text = json.dumps(status)
        return status if '"paired"' in text and _verified_ok(decode) > 0 else None

    wait_for("canary transfers verified by decode", verified, timeout=60)


def _verified_ok(address: str) -> float:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{address}:9400/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines
               if ln.startswith("pdpair_agent_verified_bytes_total{") and 'result="ok"' in ln)


def _incompatible_decode_is_refused(cluster: Cluster, runner: Any, ns: str) -> None:
    """A decode started with another model profile: the agents refuse it, and the PDPair says why."""
    gen = pdpair(cluster, ns, "pure-kv")["status"]["generationHash"]
    cm = f"pure-kv-agent-{gen}"
    skewed = yaml.safe_load(get(cluster, "configmap", ns, cm)["data"]["decode.yaml"])
    skewed["model"]["profile"] = "qwen3-next"
    patch = {"data": {"decode.yaml": yaml.safe_dump(skewed)}}
    cluster.kubectl("patch", "configmap", cm, "-n", ns, "--type=merge", "-p", json.dumps(patch))
    decode = _by_role(cluster, ns, "pure-kv", "decode")["metadata"]
    runner.delete_pod(decode["name"])

    def refused() -> dict[str, Any] | None:
        cond = condition(pdpair(cluster, ns, "pure-kv"), "TransferReady")
        return cond if (cond.get("status"), cond.get("reason")) == ("False", "HandshakeRefused") else None

    cond = wait_for("TransferReady=False from the agents", refused, timeout=120)
    assert "pure-kv on prefill vs qwen3-next on decode" in cond["message"], cond
    replacement = _by_role(cluster, ns, "pure-kv", "decode")
    assert replacement["metadata"]["uid"] != decode["uid"]
    reports = [condition(p, "pdpair.io/TransferReady") for p in pods(cluster, ns, "pure-kv")]
    refusals = [r for r in reports if r.get("reason") == "HandshakeRefused" and "qwen3-next" in r["message"]]
    assert refusals, reports
    obj = pdpair(cluster, ns, "pure-kv")
    assert condition(obj, "Ready")["status"] == "False" and condition(obj, "Degraded")["status"] == "True"
    events = get(cluster, "events", ns, "--field-selector", "involvedObject.name=pure-kv")["items"]
    assert any(e["reason"] == "TransferReadyFalse" and e["type"] == "Warning" for e in events), events


def test_agents_without_the_right_to_report_fail_at_once_by_name(cluster: Cluster, ns: str,
                                                                 tmp_path: Path) -> None:
    """``spec.serviceAccountName`` names an account with no RBAC: each real agent, holding only that
    account's token, exits at start with one line that names the account and the missing right; no pod
    reports TransferReady, so the PDPair never turns Ready."""
    from operator_support import REPO

    from devcluster import PodRunner

    cluster.kubectl("create", "serviceaccount", "no-rights", "-n", ns)
    apply(cluster, ns, pdpair_yaml("norights", 1, 1, serviceAccountName="no-rights"))
    agent = [str(REPO / ".venv" / "bin" / "pdpair-agent")]
    with PodRunner(cluster, ns, {"pdpair-agent": agent}, selector="pdpair.io/name=norights",
                   workdir=tmp_path / "pods") as runner:
        local = runner.wait_for_pods(2, timeout=90)
        assert all(p.tokens == [f"system:serviceaccount:{ns}:no-rights"] for p in local)
        wait_for("both agents exited", lambda: not any(p.alive() for p in local), timeout=60)
        for p in local:
            assert p.returncodes() == {"agent": 2}, runner.logs(p.name)
            errors = [ln for ln in runner.logs(p.name).splitlines() if ln.startswith("pdpair-agent: error:")]
            why = f"system:serviceaccount:{ns}:no-rights may not patch pods/status of {ns}/{p.name}"
            assert len(errors) == 1 and why in errors[0], runner.logs(p.name)
    assert not [q for q in pods(cluster, ns, "norights") if condition(q, "pdpair.io/TransferReady")]
    assert condition(pdpair(cluster, ns, "norights"), "Ready").get("status") != "True"
    assert cluster.kubectl("get", "serviceaccount", "norights-agent", "-n", ns, check=False).returncode != 0
