"""The reconcile step as a pure function: ``plan(owner, observed, now) -> Plan``. No I/O, no clock.

Steps, in order:

1. **Failures.** A Failed (or exited) pod is recorded in ``status.failures`` (count, time, crash context)
   and deleted; its slot is refilled only after an exponential backoff, and the replacement carries the
   count and the last failure in annotations so the crash context survives the old pod.
2. **Targets.** Steady state: the spec's replica counts, indices ``0..n-1``, extras deleted highest index
   first. During a rollout (pods of another generation exist) the spec's P:D ratio is cut into
   ``g = gcd(P, D)`` units of ``(P/g, D/g)`` pods. The new generation gets ``ready_units + maxSurgeUnits``
   units; the old keeps ``g - ready_units`` units, so an old unit goes only once a new unit is ready and
   both generations stay in ratio. ``Recreate`` empties the old generation first.
3. **Pairing.** Each generation has its own ConfigMap and bootstrap Service (named by the hash): a
   decode finds only prefills of its generation, so generations never pair. With DRA GPUs, each
   generation and role also has a ResourceClaimTemplate its pods' claims come from. Children of
   generations with no pods left are deleted.
4. **Status** recomputed from the pods (``status.py``); written only when it changed; Events for
   condition flips, rollout start and completion, and failures.

Before all of these, a spec no agent could serve (``validate.py``) gets the ``InvalidSpec`` condition
and nothing else: no pod, no child, and an older generation's pods keep serving. The PDPair's pairing
Secret is created once, when absent, with a key from ``new_key``; a present one is never rewritten.
Its NetworkPolicy is created, patched to the spec, or deleted when ``security.networkPolicy`` is off.

Names are deterministic, so replaying a plan against a stale view is harmless: a repeated create
answers 409, a repeated delete 404 (deletes carry a UID precondition so a replacement is never hit).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec

from . import identity, naming, render, validate
from .observe import ChildView, Owner, PodView
from .spec import ROLES, Role, generation_hash
from .status import RolloutFacts, build_status, condition, transition_events

BACKOFF_BASE_SECONDS = 5.0
BACKOFF_CAP_SECONDS = 300.0
FAILURE_MEMORY_SECONDS = 600.0
"""A slot serving this long after its last failure starts its backoff afresh."""
DEFAULT_SCRAPER: dict[str, Any] = {
    "namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
"""Who may reach the agents' metrics port (a NetworkPolicyPeer): Prometheus pods in any namespace."""


def new_pairing_key() -> bytes:
    return secrets.token_bytes(render.PAIRING_KEY_BYTES)


@dataclass(frozen=True)
class Delete:
    kind: str
    name: str
    uid: str = ""
    role: str = ""
    """A pod's role: prefill pods go first (``Plan.delete_waves``)."""


@dataclass(frozen=True)
class Patch:
    kind: str
    name: str
    body: dict[str, Any]


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    pods: tuple[PodView, ...] = ()
    children: tuple[ChildView, ...] = ()


@dataclass(frozen=True)
class Plan:
    creates: tuple[dict[str, Any], ...] = ()
    deletes: tuple[Delete, ...] = ()
    patches: tuple[Patch, ...] = ()
    status: dict[str, Any] | None = None
    """The new status, or None when it is unchanged."""
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None
    generation: str = ""

    def create_waves(self) -> list[tuple[dict[str, Any], ...]]:
        """Creates in the order the executor runs them, each wave only after the last one succeeded:
        every other child (the pods' ServiceAccount must exist before them), then decode pods, then
        prefill pods; and ``delete_waves``: prefill pods first. An operator stopped between two waves
        (killed, its API server gone) so never leaves a generation with prefill pods but no decode,
        whose prefills could serve no one."""
        children = tuple(m for m in self.creates if m["kind"] != "Pod")
        pods = tuple(m for m in self.creates if m["kind"] == "Pod")
        decode = tuple(m for m in pods if _role(m) != "prefill")
        prefill = tuple(m for m in pods if _role(m) == "prefill")
        return [w for w in (children, decode, prefill) if w]

    def delete_waves(self) -> list[tuple[Delete, ...]]:
        return _waves(self.deletes, lambda d: d.kind == "Pod" and d.role == "prefill")


def _role(manifest: dict[str, Any]) -> str:
    return str(manifest["metadata"].get("labels", {}).get(naming.LABEL_ROLE, ""))


def _waves(items: tuple[Any, ...], first: Any) -> list[tuple[Any, ...]]:
    head = tuple(i for i in items if first(i))
    tail = tuple(i for i in items if not first(i))
    return [w for w in (head, tail) if w]


@dataclass
class _Work:
    creates: list[dict[str, Any]] = field(default_factory=list)
    deletes: list[Delete] = field(default_factory=list)
    patches: list[Patch] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    backoff: list[str] = field(default_factory=list)
    requeue: list[float] = field(default_factory=list)


def rfc3339(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str, default: datetime) -> datetime:
    try:
        return datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return default


def backoff_seconds(count: int) -> float:
    return min(BACKOFF_BASE_SECONDS * 2 ** max(count - 1, 0), BACKOFF_CAP_SECONDS)


def plan(owner: Owner, observed: Observed, now: datetime, *, scraper: dict[str, Any] | None = None,
         new_key: Callable[[], bytes] = new_pairing_key,
         agent_role: str = identity.DEFAULT_AGENT_CLUSTER_ROLE) -> Plan:
    """``scraper``: the NetworkPolicyPeer admitted to the metrics port (default ``DEFAULT_SCRAPER``);
    ``new_key``: the pairing key's source, called only when the PDPair has no Secret yet;
    ``agent_role``: the ClusterRole the agents' ServiceAccount is bound to (``identity.py``)."""
    gen = generation_hash(owner.spec)
    invalid = validate.invalid_reason(owner, gen)
    if invalid is not None:
        return _invalid_plan(owner, gen, observed, invalid, now)
    work = _Work()
    _plan_security(owner, observed, scraper if scraper is not None else DEFAULT_SCRAPER, new_key, work)
    _plan_identity(owner, observed, agent_role, work)
    failures = _record_failures(owner, gen, observed.pods, now, work)
    old_pods = _plan_pods(owner, gen, observed.pods, failures, now, work)
    _plan_children(owner, gen, observed, work)
    _plan_router(owner, gen, observed, work)
    pod_changes = sum(1 for c in work.creates if c["kind"] == "Pod") + sum(
        1 for d in work.deletes if d.kind == "Pod")
    facts = RolloutFacts(pending_changes=pod_changes, old_pods=old_pods, backoff=tuple(work.backoff))
    status = build_status(owner, gen, observed.pods, facts, failures, rfc3339(now))
    events = work.events + _status_events(owner.status, status, gen)
    return Plan(
        creates=tuple(work.creates), deletes=tuple(work.deletes), patches=tuple(work.patches),
        status=None if status == owner.status else status, events=tuple(events),
        requeue_after=min(work.requeue) if work.requeue else None, generation=gen,
    )


def _invalid_plan(owner: Owner, gen: str, observed: Observed, invalid: tuple[str, str],
                  now: datetime) -> Plan:
    """The spec cannot be served: report why, create and delete nothing."""
    old_pods = sum(1 for p in observed.pods if p.generation != gen)
    facts = RolloutFacts(old_pods=old_pods, invalid=invalid)
    failures = list(owner.status.get("failures") or [])
    status = build_status(owner, gen, observed.pods, facts, failures, rfc3339(now))
    events = _status_events(owner.status, status, gen)
    return Plan(status=None if status == owner.status else status, events=tuple(events), generation=gen)


def _plan_security(owner: Owner, observed: Observed, scraper: dict[str, Any],
                   new_key: Callable[[], bytes], work: _Work) -> None:
    """The pairing Secret (created when absent, never rewritten) and the NetworkPolicy."""
    seen = {(c.kind, c.name): c for c in observed.children}
    if ("Secret", naming.pairing_secret(owner.name)) not in seen:
        work.creates.append(render.build_pairing_secret(owner, new_key()))
    have = seen.get(("NetworkPolicy", naming.network_policy(owner.name)))
    if not owner.spec.security.network_policy:
        if have is not None and not have.deleting:
            work.deletes.append(Delete("NetworkPolicy", have.name))
        return
    manifest = render.build_network_policy(owner, scraper)
    if have is None:
        work.creates.append(manifest)
    elif not have.deleting and have.render_hash != manifest["metadata"]["annotations"][
            naming.ANNOTATION_RENDER_HASH]:
        body = {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind")}
        work.patches.append(Patch("NetworkPolicy", have.name, body))


def _plan_identity(owner: Owner, observed: Observed, agent_role: str, work: _Work) -> None:
    """The agents' ServiceAccount and RoleBinding: created, patched (the RoleBinding's roleRef cannot
    change: deleted, then created again), or deleted once ``spec.serviceAccountName`` names another."""
    seen = {(c.kind, c.name): c for c in observed.children}
    desired = {(m["kind"], m["metadata"]["name"]): m for m in render.build_agent_identity(owner, agent_role)}
    name = naming.agent_service_account(owner.name)
    for key in (("ServiceAccount", name), ("RoleBinding", name)):
        have, want = seen.get(key), desired.get(key)
        if have is not None and have.deleting:
            continue
        if want is None:
            if have is not None:
                work.deletes.append(Delete(*key))
        elif have is None:
            work.creates.append(want)
        elif have.render_hash != want["metadata"]["annotations"][naming.ANNOTATION_RENDER_HASH]:
            if key[0] == "RoleBinding":
                work.deletes.append(Delete(*key))
            else:
                body = {k: v for k, v in want.items() if k not in ("apiVersion", "kind")}
                work.patches.append(Patch(*key, body))


def _record_failures(owner: Owner, gen: str, pods: tuple[PodView, ...], now: datetime,
                     work: _Work) -> list[dict[str, Any]]:
    """Step 1: keep one record per failed slot (pod name); delete failed pods."""
    records = {r["pod"]: dict(r) for r in owner.status.get("failures") or [] if "pod" in r}
    for pod in pods:
        if not pod.failed or pod.deleting:
            continue
        work.deletes.append(Delete("Pod", pod.name, pod.uid, pod.role))
        old = records.get(pod.name)
        if old is not None and old.get("uid") == pod.uid:
            continue
        count = max(int(old.get("count", 0)) if old else 0, pod.restarts) + 1
        records[pod.name] = {"pod": pod.name, "uid": pod.uid, "count": count,
                             "lastFailureTime": pod.finished_at or rfc3339(now), "reason": pod.failure}
        work.events.append(Event("Warning", "PodFailed", f"{pod.name} failed ({pod.failure or pod.phase}); "
                                 f"replacing in {backoff_seconds(count):.0f}s (failure {count})"))
    serving = {p.name for p in pods if p.serving}
    kept = []
    for name, rec in sorted(records.items()):
        since = (now - _parse_time(rec.get("lastFailureTime", ""), now)).total_seconds()
        if name in serving and since > FAILURE_MEMORY_SECONDS:
            continue
        if not name.startswith(f"{owner.name}-{gen}-"):
            continue
        kept.append(rec)
    return kept


def _targets(owner: Owner, new: list[PodView],
             old_all: list[PodView]) -> tuple[dict[Role, int], dict[Role, int]]:
    """Step 2: (pods wanted in the new generation, old-generation pods that may stay) per role."""
    spec = owner.spec
    want: dict[Role, int] = {"prefill": spec.prefill.replicas, "decode": spec.decode.replicas}
    if not old_all:
        return want, {"prefill": 0, "decode": 0}
    if spec.update_strategy.type == "Recreate":
        return {"prefill": 0, "decode": 0}, {"prefill": 0, "decode": 0}
    units = math.gcd(want["prefill"], want["decode"])
    if units == 0:
        return want, {"prefill": 0, "decode": 0}
    unit = {r: want[r] // units for r in ROLES}
    serving = {r: sum(1 for p in new if p.role == r and p.serving) for r in ROLES}
    ready_units = min(serving[r] // unit[r] for r in ROLES if unit[r] > 0)
    target = min(units, ready_units + max(1, spec.update_strategy.max_surge_units))
    keep = max(units - ready_units, 0)
    return {r: target * unit[r] for r in ROLES}, {r: keep * unit[r] for r in ROLES}


def _plan_pods(owner: Owner, gen: str, pods: tuple[PodView, ...], failures: list[dict[str, Any]],
               now: datetime, work: _Work) -> int:
    """Steps 1-2 for pods; returns how many pods of older generations still exist."""
    active = [p for p in pods if not p.deleting and not p.failed]
    new = [p for p in active if p.generation == gen]
    old_all = [p for p in pods if p.generation != gen]
    want, keep = _targets(owner, new, old_all)
    present = {p.name for p in pods}
    records = {r["pod"]: r for r in failures}
    for role in ROLES:
        for index in range(want[role]):
            name = naming.pod_name(owner.name, gen, role, index)
            if name not in present:
                _create_pod(owner, gen, role, index, records.get(name), now, work)
        extra = [p for p in new if p.role == role and p.index >= want[role]]
        old = sorted((p for p in active if p.generation != gen and p.role == role),
                     key=lambda p: (not p.serving, p.index))
        extra += old[keep[role]:]
        for pod in sorted(extra, key=lambda p: (-p.index, p.name)):
            work.deletes.append(Delete("Pod", pod.name, pod.uid, pod.role))
    return len(old_all)


def _create_pod(owner: Owner, gen: str, role: Role, index: int, record: dict[str, Any] | None,
                now: datetime, work: _Work) -> None:
    if record is None:
        work.creates.append(render.build_pod(owner, gen, role, index))
        return
    count = int(record.get("count", 1))
    due = _parse_time(record.get("lastFailureTime", ""), now).timestamp() + backoff_seconds(count)
    wait = due - now.timestamp()
    if wait > 0:
        work.requeue.append(wait)
        work.backoff.append(f"{record['pod']} failed {count}x ({record.get('reason') or 'unknown'}); "
                            f"replacing in {wait:.0f}s")
        return
    failure = f"{record.get('lastFailureTime', '')} {record.get('reason') or ''}".strip()
    work.creates.append(render.build_pod(owner, gen, role, index, restarts=count, last_failure=failure))


_RENDERED: dict[bytes, tuple[dict[str, Any], ...]] = {}
_RENDERED_MAX = 4096


def _desired_children(owner: Owner, gen: str) -> tuple[dict[str, Any], ...]:
    """The long-lived children, memoised on the owner's identity and spec: a pass renders them only to
    compare render hashes, and rendering the agents' YAML config on every pod event was a tenth of the
    operator's CPU at 500 PDPairs. The manifests are shared: nothing downstream mutates them."""
    key = msgspec.json.encode((owner.name, owner.namespace, owner.uid, gen, owner.spec))
    cached = _RENDERED.get(key)
    if cached is None:
        if len(_RENDERED) >= _RENDERED_MAX:
            _RENDERED.clear()
        templates = (render.build_gpu_claim_template(owner, gen, role) for role in ROLES)
        cached = _RENDERED[key] = (
            render.build_config_map(owner, gen),
            render.build_bootstrap_service(owner, gen),
            render.build_headless_service(owner),
            render.build_metrics_service(owner),
            *(t for t in templates if t is not None),
        )
    return cached


IMMUTABLE_KINDS = frozenset({"ResourceClaimTemplate"})
"""Children whose spec the API server refuses to change; named by generation, so never patched."""


def _plan_children(owner: Owner, gen: str, observed: Observed, work: _Work) -> None:
    """Step 3: per-generation ConfigMap, bootstrap Service and (DRA) GPU claim templates, plus the two
    stable Services."""
    live_gens = {gen} | {p.generation for p in observed.pods}
    seen = {(c.kind, c.name): c for c in observed.children}
    for manifest in _desired_children(owner, gen):
        meta = manifest["metadata"]
        have = seen.get((manifest["kind"], meta["name"]))
        if have is None:
            work.creates.append(manifest)
        elif (not have.deleting and manifest["kind"] not in IMMUTABLE_KINDS
              and have.render_hash != meta["annotations"][naming.ANNOTATION_RENDER_HASH]):
            body = {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind")}
            work.patches.append(Patch(manifest["kind"], meta["name"], body))
    for child in observed.children:
        if child.generation and child.generation not in live_gens and not child.deleting:
            work.deletes.append(Delete(child.kind, child.name))


ROUTER_KINDS = frozenset({"ServiceAccount", "Role", "RoleBinding", "Deployment", "Service", "NetworkPolicy",
                          "PodDisruptionBudget"})


def _plan_router(owner: Owner, gen: str, observed: Observed, work: _Work) -> None:
    """Step 4: a serving PDPair's router (``serving``), patched to the current generation's selectors;
    deleted once the spec no longer serves."""
    desired = render.build_router_children(owner, gen, owner.spec.security.network_policy)
    seen = {(c.kind, c.name): c for c in observed.children}
    for manifest in desired:
        meta = manifest["metadata"]
        have = seen.get((manifest["kind"], meta["name"]))
        if have is None:
            work.creates.append(manifest)
        elif not have.deleting and have.render_hash != meta["annotations"][naming.ANNOTATION_RENDER_HASH]:
            body = {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind")}
            work.patches.append(Patch(manifest["kind"], meta["name"], body))
    wanted = {(m["kind"], m["metadata"]["name"]) for m in desired}
    names = {naming.router(owner.name), naming.router_network_policy(owner.name)}
    for child in observed.children:
        if (child.kind in ROUTER_KINDS and child.name in names and not child.deleting
                and (child.kind, child.name) not in wanted):
            work.deletes.append(Delete(child.kind, child.name))


def _status_events(before: dict[str, Any], after: dict[str, Any], gen: str) -> list[Event]:
    events = [Event(t, r, m) for t, r, m in transition_events(before, after)]
    previous = before.get("generationHash")
    if previous and previous != gen:
        events.append(Event("Normal", "RolloutStarted", f"generation {previous} -> {gen}"))
    was = condition(before, "Progressing").get("reason")
    now_reason = condition(after, "Progressing").get("reason")
    if was == "RollingOut" and now_reason != "RollingOut":
        events.append(Event("Normal", "RolloutComplete", f"all pods at generation {gen}"))
    return events
