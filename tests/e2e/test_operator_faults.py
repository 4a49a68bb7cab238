"""The operator under faults on the real control plane (devcluster): a child deleted, the operator
killed at every step of a coordinated rollout, the API server restarted mid-reconcile, concurrent
conflicting edits, a node removed under running pods. Each test asserts that the PDPair converges
within its bound and records what it observed as a row of the fault matrix (``scripts/faults``).

The agents are played by the test (``FakeAgents``): these faults are the control plane's."""

from __future__ import annotations

import contextlib
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faults_support import FaultRow
from operator_support import (
    FakeAgents,
    OperatorProcess,
    condition,
    get,
    install_crd,
    pdpair,
    pdpair_yaml,
    pods,
)

from dataplane.harness.waiting import wait_for
from devcluster import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.faults]

CHILD_KINDS = ("pods", "services", "configmaps", "secrets", "networkpolicies")
"""Every kind of child the operator owns for a PDPair without DRA GPUs."""
RECREATE_BOUND = 30.0
QUIET_SECONDS = 30.0
LABEL = "pdpair.io/name"


@pytest.fixture
def ns(cluster: Cluster) -> Iterator[str]:
    install_crd(cluster)
    name = f"faults-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def operator(cluster: Cluster, ns: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster, tmp_path / "operator.log", ns)
    op.start()
    yield op
    op.stop()


def apply(cluster: Cluster, ns: str, text: str) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=text)


def children(cluster: Cluster, ns: str, name: str) -> dict[str, dict[str, str]]:
    """Each kind's live children, name → UID."""
    out: dict[str, dict[str, str]] = {}
    for kind in CHILD_KINDS:
        items = get(cluster, kind, ns, "-l", f"{LABEL}={name}")["items"]
        out[kind] = {o["metadata"]["name"]: o["metadata"]["uid"] for o in items
                     if not o["metadata"].get("deletionTimestamp")}
    return out


def serving(cluster: Cluster, ns: str, name: str, p: int, d: int) -> dict[str, Any] | None:
    """The PDPair once Ready with exactly ``p`` + ``d`` Running pods of its current generation."""
    obj = pdpair(cluster, ns, name)
    if condition(obj, "Ready").get("status") != "True":
        return None
    gen = obj["status"].get("generationHash")
    live = [x for x in pods(cluster, ns, name) if not x["metadata"].get("deletionTimestamp")]
    roles = [x["metadata"]["labels"]["pdpair.io/role"] for x in live
             if x["metadata"]["labels"]["pdpair.io/generation"] == gen
             and x["status"].get("phase") == "Running"]
    ok = len(live) == p + d and roles.count("prefill") == p and roles.count("decode") == d
    return obj if ok else None


def quiet(cluster: Cluster, ns: str, names: list[str], op: OperatorProcess, seconds: float) -> None:
    """No write by the operator for ``seconds``: no create, patch or delete, no status change of any of
    ``names``, no new Event."""
    def marks() -> tuple[float, list[str], int]:
        versions = [pdpair(cluster, ns, n)["metadata"]["resourceVersion"] for n in names]
        return op.writes(), versions, len(get(cluster, "events", ns)["items"])

    before = marks()
    time.sleep(seconds)
    after = marks()
    assert after == before, f"the operator kept writing after converging: {before} -> {after}"


def test_each_kind_of_child_deleted_is_recreated_and_nothing_else_moves(
        cluster: Cluster, ns: str, operator: OperatorProcess, fault_row: FaultRow) -> None:
    fault_row.fault = "a child of each kind deleted (Pod, Service, ConfigMap, Secret, NetworkPolicy)"
    fault_row.injected = "kubectl delete of one child per kind, one PDPair per kind, all at once"
    fault_row.bound = (f"recreated ≤ {RECREATE_BOUND:.0f} s; siblings' UIDs kept; "
                       f"no write for {QUIET_SECONDS:.0f} s")
    names = [f"kid-{kind[:3]}" for kind in CHILD_KINDS]
    apply(cluster, ns, "---\n".join(pdpair_yaml(n, 1, 2) for n in names))
    with contextlib.ExitStack() as stack:
        for n in names:
            stack.enter_context(FakeAgents(cluster, ns, n))
        for n in names:
            wait_for(f"{n} serving", lambda n=n: serving(cluster, ns, n, 1, 2), timeout=120)
        before = {n: children(cluster, ns, n) for n in names}
        victims = {n: (kind, sorted(before[n][kind])[0]) for n, kind in zip(names, CHILD_KINDS, strict=True)}
        start = time.monotonic()
        for kind, victim in victims.values():
            cluster.kubectl("delete", kind, victim, "-n", ns, "--wait=false")
        took: dict[str, float] = {}

        def recreated() -> bool:
            for n, (kind, victim) in victims.items():
                if n not in took:
                    uid = children(cluster, ns, n)[kind].get(victim)
                    if uid and uid != before[n][kind][victim]:
                        took[n] = time.monotonic() - start
            return len(took) == len(victims)

        wait_for("every deleted child recreated", recreated, timeout=RECREATE_BOUND, interval=0.2)
        for n in names:
            wait_for(f"{n} serving again", lambda n=n: serving(cluster, ns, n, 1, 2), timeout=60)
        for n, (kind, victim) in victims.items():
            now = children(cluster, ns, n)
            for k, members in before[n].items():
                kept = {m: u for m, u in members.items() if (k, m) != (kind, victim)}
                assert {m: now[k].get(m) for m in kept} == kept, f"{n}: siblings replaced in {k}"
        fault_row.observed = ", ".join(f"{victims[n][0]} {took[n]:.1f} s" for n in names)
        quiet(cluster, ns, names, operator, QUIET_SECONDS)
    fault_row.observed += f"; quiet {QUIET_SECONDS:.0f} s"


def test_operator_killed_at_every_rollout_step_completes_it(
        cluster: Cluster, ns: str, operator: OperatorProcess, fault_row: FaultRow) -> None:
    """SIGKILL whenever the pods change (after a random 0-300 ms, so some kills land mid-wave), and a
    new operator at once. Throughout, no generation has prefill pods without decode pods."""
    fault_row.fault = "operator killed at each step of a coordinated rollout"
    fault_row.injected = "SIGKILL 0-300 ms after every change of the pod set, restarted at once"
    fault_row.bound = "rollout completes ≤ 240 s; no duplicate or orphan; never prefill without decode"
    apply(cluster, ns, pdpair_yaml("roll", 2, 4))
    rng = random.Random(34)
    violations: list[dict[str, dict[str, int]]] = []
    stop = threading.Event()

    def census() -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for x in pods(cluster, ns, "roll"):
            if not x["metadata"].get("deletionTimestamp"):
                labels = x["metadata"]["labels"]
                gen = out.setdefault(labels["pdpair.io/generation"], {"prefill": 0, "decode": 0})
                gen[labels["pdpair.io/role"]] += 1
        return out

    def watch() -> None:
        while not stop.wait(0.1):
            try:
                snap = census()
            except subprocess.SubprocessError:
                continue
            if any(c["prefill"] and not c["decode"] for c in snap.values()):
                violations.append(snap)

    with FakeAgents(cluster, ns, "roll"):
        wait_for("roll serving", lambda: serving(cluster, ns, "roll", 2, 4), timeout=120)
        old = pdpair(cluster, ns, "roll")["status"]["generationHash"]
        before = children(cluster, ns, "roll")
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        start = time.monotonic()
        apply(cluster, ns, pdpair_yaml("roll", 2, 4, image="ghcr.io/pdpair/agent:0.2.0"))
        last = {g: dict(c) for g, c in census().items()}
        try:
            while time.monotonic() - start < 240 and operator.kills < 30:
                obj = serving(cluster, ns, "roll", 2, 4)
                if obj is not None and obj["status"]["generationHash"] != old:
                    break
                snap = census()
                if snap != last:
                    last = snap
                    time.sleep(rng.uniform(0, 0.3))
                    operator.kill()
                    operator.start()
                time.sleep(0.1)
            took = time.monotonic() - start
        finally:
            stop.set()
            watcher.join(timeout=5)
        obj = wait_for("rollout complete", lambda: serving(cluster, ns, "roll", 2, 4), timeout=30)
        new = obj["status"]["generationHash"]
        assert new != old and took < 240, (took, operator.kills)
    assert not violations, f"a generation had prefill without decode: {violations[:3]}"
    wait_for("old generation's children gone", lambda: not [
        m for members in children(cluster, ns, "roll").values() for m in members if old in m], timeout=60)
    kids = {kind: sorted(members) for kind, members in children(cluster, ns, "roll").items()}
    assert kids == {kind: sorted(m.replace(old, new) for m in members) for kind, members in before.items()}
    for kind in CHILD_KINDS:
        for item in get(cluster, kind, ns, "-l", f"{LABEL}=roll")["items"]:
            owners = [o["name"] for o in item["metadata"].get("ownerReferences", [])]
            assert owners == ["roll"], (kind, item["metadata"]["name"], owners)
    fault_row.observed = f"completed in {took:.1f} s through {operator.kills} kills"


def test_api_server_restarted_mid_reconcile_converges(
        cluster: Cluster, ns: str, operator: OperatorProcess, fault_row: FaultRow) -> None:
    fault_row.fault = "API server restarted mid-reconcile"
    fault_row.injected = "SIGKILL of kube-apiserver as the first pod appears, started again at once"
    fault_row.bound = "Ready with exact children ≤ 120 s after the API server is back; operator alive"
    apply(cluster, ns, pdpair_yaml("api", 2, 2))
    with FakeAgents(cluster, ns, "api"):
        wait_for("first pod", lambda: pods(cluster, ns, "api"), timeout=60, interval=0.05)
        down = cluster.restart("kube-apiserver")
        back = time.monotonic()
        wait_for("api serving", lambda: serving(cluster, ns, "api", 2, 2), timeout=120)
        took = time.monotonic() - back
    assert operator.proc is not None and operator.proc.poll() is None, "the operator exited"
    kids = children(cluster, ns, "api")
    assert (len(kids["pods"]), len(kids["services"]), len(kids["configmaps"])) == (4, 3, 1), kids
    fault_row.observed = f"API server back in {down:.1f} s; Ready {took:.1f} s later"


def test_conflicting_concurrent_edits_converge_to_the_last_spec(
        cluster: Cluster, ns: str, operator: OperatorProcess, fault_row: FaultRow) -> None:
    """Four writers replace the spec from stale reads (the API server refuses some with a
    resourceVersion conflict) while the operator writes status: the PDPair ends as its final spec says."""
    fault_row.fault = "conflicting concurrent spec edits"
    fault_row.injected = "4 threads x 5 read-modify-replace of spec.decode.replicas (1-4), stale reads"
    fault_row.bound = "converges to the stored spec ≤ 60 s after the last edit"
    apply(cluster, ns, pdpair_yaml("edit", 1, 2))
    conflicts: list[str] = []
    with FakeAgents(cluster, ns, "edit"):
        wait_for("edit serving", lambda: serving(cluster, ns, "edit", 1, 2), timeout=120)

        def writer(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(5):
                obj = pdpair(cluster, ns, "edit")
                time.sleep(rng.uniform(0, 0.2))  # others write meanwhile: this read goes stale
                obj["spec"]["decode"]["replicas"] = rng.randint(1, 4)
                obj.pop("status", None)
                proc = cluster.kubectl("replace", "-n", ns, "-f", "-", input=_yaml(obj), check=False)
                if proc.returncode and "modified" in proc.stderr:
                    conflicts.append(proc.stderr.strip())
                elif proc.returncode:
                    raise AssertionError(proc.stderr)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        last_edit = time.monotonic()
        want = pdpair(cluster, ns, "edit")["spec"]["decode"]["replicas"]
        wait_for(f"edit serving 1+{want}", lambda: serving(cluster, ns, "edit", 1, want), timeout=60)
        took = time.monotonic() - last_edit
    assert conflicts, "no edit met a conflict: the writers never raced"
    fault_row.observed = f"{len(conflicts)} conflicts; converged to 1+{want} in {took:.1f} s"


def test_node_removed_under_running_pods_reschedules_them(
        cluster: Cluster, ns: str, operator: OperatorProcess, fault_row: FaultRow) -> None:
    fault_row.fault = "a kwok node removed under running pods"
    fault_row.injected = "kubectl delete node; the pod GC deletes its pods (it waits 40 s for the node)"
    fault_row.bound = "Ready again with every pod on a live node ≤ 120 s"
    apply(cluster, ns, pdpair_yaml("node", 2, 2))
    with FakeAgents(cluster, ns, "node"):
        wait_for("node serving", lambda: serving(cluster, ns, "node", 2, 2), timeout=120)
        placed = [x["spec"].get("nodeName") for x in pods(cluster, ns, "node")]
        victim = max(set(placed), key=placed.count)
        start = time.monotonic()
        cluster.kubectl("delete", "node", victim)
        try:
            def moved() -> dict[str, Any] | None:
                live = [x for x in pods(cluster, ns, "node") if not x["metadata"].get("deletionTimestamp")]
                off = all(x["spec"].get("nodeName") not in ("", None, victim) for x in live)
                return serving(cluster, ns, "node", 2, 2) if off else None

            wait_for("pods rescheduled off the removed node", moved, timeout=120, interval=0.5)
            took = time.monotonic() - start
        finally:
            cluster.add_node(victim)
    fault_row.observed = f"{placed.count(victim)} pods moved, Ready in {took:.1f} s"


def _yaml(obj: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(obj)
