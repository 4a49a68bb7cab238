"""PDPair status as a pure function of the observed pods (plus the previous status, for transition times).

Conditions follow metav1.Condition: ``lastTransitionTime`` moves only when a condition's status flips,
``observedGeneration`` is the spec generation they were computed from. ``TransferReady`` is what the
agents themselves reported on their pods (condition ``pdpair.io/TransferReady``): a schema mismatch
between prefill and decode surfaces here with the agent's own reason and message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from . import naming, serving
from .observe import Owner, PodView
from .spec import ROLES, Role

CONDITION_TYPES = ("Ready", "Progressing", "Degraded", "TransferReady", "PeersRefused", "InvalidSpec")
REFUSAL_REASONS = ("unauthenticated", "bad_mac", "replay", "foreign_pdpair")
"""Why an agent refused a peer, as the agents count them (``pdpair.io/PeerRefusals`` messages)."""
_MAX_COUNT_DIGITS = 15


class Cond(msgspec.Struct, frozen=True):
    type: str
    status: str
    reason: str
    message: str = ""


class RolloutFacts(msgspec.Struct, frozen=True):
    """What the planner knows beyond the pods: pending work and failures waiting out their backoff."""

    pending_changes: int = 0
    old_pods: int = 0
    backoff: tuple[str, ...] = ()
    """Messages describing failed slots waiting to be replaced."""
    invalid: tuple[str, str] | None = None
    """(reason, message) when the spec cannot be served: no pods are created for it."""


def refusal_counts(message: str) -> dict[str, int]:
    """``unauthenticated=N bad_mac=N replay=N foreign_pdpair=N`` as counts; anything else in the
    message (an agent's report is not trusted to be well formed) counts nothing."""
    counts = dict.fromkeys(REFUSAL_REASONS, 0)
    for token in message.split(maxsplit=2 * len(REFUSAL_REASONS))[: 2 * len(REFUSAL_REASONS)]:
        name, _, value = token.partition("=")
        if name in counts and value.isascii() and value.isdigit() and len(value) <= _MAX_COUNT_DIGITS:
            counts[name] = int(value)
    return counts


def _camel(reason: str) -> str:
    return "".join(part.capitalize() for part in reason.split("_"))


def refusals_condition(pods: Sequence[PodView]) -> Cond:
    """The agents' ``pdpair.io/PeerRefusals`` reports summed over the PDPair's pods: True once any agent
    refused a peer, with the most frequent reason."""
    totals = dict.fromkeys(REFUSAL_REASONS, 0)
    reporting = []
    for pod in sorted(pods, key=lambda p: p.name):
        if pod.deleting or pod.refusals is None or pod.refusals.status != "True":
            continue
        reporting.append(pod.name)
        for reason, count in refusal_counts(pod.refusals.message).items():
            totals[reason] += count
    summary = " ".join(f"{reason}={totals[reason]}" for reason in REFUSAL_REASONS)
    if not reporting:
        return Cond("PeersRefused", "False", "None", summary)
    top = max(REFUSAL_REASONS, key=lambda reason: totals[reason])
    reason = _camel(top) if totals[top] else "Unknown"
    shown = ", ".join(reporting[:3]) + (f" and {len(reporting) - 3} more" if len(reporting) > 3 else "")
    return Cond("PeersRefused", "True", reason, f"{summary} (reported by {shown})")


def transfer_condition(pods: Sequence[PodView], desired: dict[Role, int]) -> Cond:
    """Aggregate the agents' reports: any False wins (with its reason); True needs every pod True."""
    if sum(desired.values()) == 0:
        return Cond("TransferReady", "Unknown", "ScaledToZero", "no replicas requested")
    for pod in sorted(pods, key=lambda p: p.name):
        if pod.transfer is not None and pod.transfer.status == "False":
            reason = pod.transfer.reason or "TransferNotReady"
            return Cond("TransferReady", "False", reason, f"{pod.name}: {pod.transfer.message}".rstrip(": "))
    reported = [p for p in pods if p.transfer is not None and p.transfer.status == "True"]
    counts = {role: sum(1 for p in reported if p.role == role) for role in ROLES}
    if all(counts[role] >= desired[role] for role in ROLES):
        reason = reported[0].transfer.reason if reported and reported[0].transfer else ""
        return Cond("TransferReady", "True", reason or "HandshakeComplete",
                    f"{len(reported)} agents report transfer readiness")
    waiting = sum(desired.values()) - sum(min(counts[r], desired[r]) for r in ROLES)
    return Cond("TransferReady", "Unknown", "AwaitingHandshake", f"{waiting} agents have not reported yet")


def derive_conditions(current: Sequence[PodView], desired: dict[Role, int],
                      facts: RolloutFacts) -> list[Cond]:
    if facts.invalid is not None:
        return _invalid_conditions(current, desired, facts.invalid)
    transfer = transfer_condition(current, desired)
    serving = {role: sum(1 for p in current if p.role == role and p.serving) for role in ROLES}
    all_serving = all(serving[r] >= desired[r] for r in ROLES)
    summary = ", ".join(f"{r} {serving[r]}/{desired[r]} ready" for r in ROLES)
    if transfer.status == "False":
        ready = Cond("Ready", "False", "TransferNotReady", transfer.message)
    elif facts.old_pods:
        ready = Cond("Ready", "False", "RollingOut",
                     f"{facts.old_pods} pods of older generations remain; {summary}")
    elif facts.backoff:
        ready = Cond("Ready", "False", "PodsFailing", "; ".join(facts.backoff))
    elif all_serving and sum(desired.values()) == 0:
        ready = Cond("Ready", "True", "ScaledToZero", "no replicas requested")
    elif all_serving and transfer.status == "True":
        ready = Cond("Ready", "True", "AllReplicasReady", summary)
    elif stuck := sorted((p for p in current if p.unschedulable), key=lambda p: p.name):
        ready = Cond("Ready", "False", "PodsUnschedulable",
                     f"{summary}; {stuck[0].name}: {stuck[0].unschedulable}")
    else:
        ready = Cond("Ready", "False", "ReplicasNotReady", summary)
    if facts.old_pods:
        progressing = Cond("Progressing", "True", "RollingOut",
                           f"{facts.old_pods} old-generation pods remain")
    elif facts.pending_changes or not all_serving:
        progressing = Cond("Progressing", "True", "Reconciling", summary)
    else:
        progressing = Cond("Progressing", "False", "Complete", summary)
    if facts.backoff:
        degraded = Cond("Degraded", "True", "PodsFailing", "; ".join(facts.backoff))
    elif transfer.status == "False":
        degraded = Cond("Degraded", "True", "TransferFailed", transfer.message)
    else:
        degraded = Cond("Degraded", "False", "AsExpected", "")
    return [ready, progressing, degraded, transfer, Cond("InvalidSpec", "False", "Valid", "")]


def _invalid_conditions(current: Sequence[PodView], desired: dict[Role, int],
                        invalid: tuple[str, str]) -> list[Cond]:
    reason, message = invalid
    return [Cond("Ready", "False", "InvalidSpec", message),
            Cond("Progressing", "False", "InvalidSpec", message),
            Cond("Degraded", "True", "InvalidSpec", message),
            transfer_condition(current, desired),
            Cond("InvalidSpec", "True", reason, message)]


def merge_conditions(previous: Sequence[dict[str, Any]], new: Sequence[Cond], *,
                     generation: int, now: str) -> list[dict[str, Any]]:
    """metav1.Condition dicts; a condition keeps its lastTransitionTime unless its status flipped."""
    before = {c.get("type"): c for c in previous}
    out = []
    for cond in new:
        old = before.get(cond.type)
        moved = old is None or old.get("status") != cond.status
        out.append({
            "type": cond.type, "status": cond.status, "reason": cond.reason, "message": cond.message,
            "lastTransitionTime": now if moved or old is None else old.get("lastTransitionTime", now),
            "observedGeneration": generation,
        })
    return out


def role_status(pods: Sequence[PodView], role: Role, generation: str, desired: int) -> dict[str, Any]:
    mine = [p for p in pods if p.role == role and not p.deleting]
    updated = [p for p in mine if p.generation == generation]
    ready_updated = sum(1 for p in updated if p.serving)
    return {
        "replicas": len(mine),
        "readyReplicas": sum(1 for p in mine if p.serving),
        "updatedReplicas": len(updated),
        "desiredReplicas": desired,
        "ready": f"{ready_updated}/{desired}",
    }


def build_status(owner: Owner, generation: str, pods: Sequence[PodView], facts: RolloutFacts,
                 failures: list[dict[str, Any]], now: str) -> dict[str, Any]:
    spec = owner.spec
    desired: dict[Role, int] = {"prefill": spec.prefill.replicas, "decode": spec.decode.replicas}
    current = [p for p in pods if p.generation == generation and not p.deleting and not p.failed]
    conds = [*derive_conditions(current, desired, facts), refusals_condition(pods)]
    bootstrap = naming.service_dns(naming.bootstrap_service(owner.name, generation), owner.namespace)
    status: dict[str, Any] = {
        "observedGeneration": owner.generation,
        "generationHash": generation,
        "bootstrapEndpoint": f"{bootstrap}:{spec.ports.bootstrap}",
        "prefill": role_status(pods, "prefill", generation, desired["prefill"]),
        "decode": role_status(pods, "decode", generation, desired["decode"]),
        "conditions": merge_conditions(owner.status.get("conditions") or [], conds,
                                       generation=owner.generation, now=now),
        "failures": failures,
    }
    if spec.serves:
        status["router"] = serving.router_endpoint(owner)
    return status


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in status.get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def transition_events(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(type, reason, message) Events for condition flips worth a human's attention."""
    events = []
    for kind, good in (("Ready", "True"), ("TransferReady", "True"), ("Degraded", "False"),
                       ("PeersRefused", "False"), ("InvalidSpec", "False")):
        old, new = condition(before, kind), condition(after, kind)
        if not new or old.get("status") == new["status"]:
            continue
        if not old and (kind == "Ready" or new["status"] in (good, "Unknown")):
            continue
        level = "Normal" if new["status"] == good else "Warning"
        events.append((level, f"{kind}{new['status']}", f"{new['reason']}: {new['message']}".rstrip(": ")))
    return events
