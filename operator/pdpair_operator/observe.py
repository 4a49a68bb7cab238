"""What the operator observed: small typed summaries of a PDPair and its children.

The kopf indices keep these summaries, never whole bodies, so memory stays flat with hundreds of
PDPairs and the planner's inputs are plain values a test can build in one line. Every ``*_from_body``
function is pure.
"""

from __future__ import annotations

from typing import Any

import msgspec

from . import naming
from .spec import PDPairSpec, Role, parse_spec


class PodCondition(msgspec.Struct, frozen=True):
    status: str
    reason: str = ""
    message: str = ""


class PodView(msgspec.Struct, frozen=True):
    name: str
    role: Role
    index: int
    generation: str
    uid: str = ""
    phase: str = "Pending"
    deleting: bool = False
    ready: bool = False
    """The pod's Ready condition (kubelet / kwok)."""
    transfer: PodCondition | None = None
    """The agent's ``pdpair.io/TransferReady`` report, if any."""
    refusals: PodCondition | None = None
    """The agent's ``pdpair.io/PeerRefusals`` report, if any."""
    finished_at: str = ""
    failure: str = ""
    """Crash context of a failed pod: container reason, exit code, message."""
    restarts: int = 0
    unschedulable: str = ""
    """The scheduler's reason a Pending pod has no node (for example a DRA claim it cannot allocate)."""

    @property
    def failed(self) -> bool:
        return self.phase in ("Failed", "Succeeded")

    @property
    def serving(self) -> bool:
        """Ready and transfer-ready: what the readiness gate means, checked even where kwok ignores it."""
        return self.ready and self.transfer is not None and self.transfer.status == "True"


class ChildView(msgspec.Struct, frozen=True):
    kind: str
    name: str
    generation: str = ""
    render_hash: str = ""
    deleting: bool = False


class Owner(msgspec.Struct, frozen=True):
    name: str
    namespace: str
    uid: str
    generation: int
    spec: PDPairSpec
    status: dict[str, Any] = {}


def owner_from_body(body: Any) -> Owner:
    meta = body["metadata"]
    return Owner(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta["uid"],
        generation=int(meta.get("generation") or 0),
        spec=parse_spec(dict(body.get("spec") or {})),
        status=dict(body.get("status") or {}),
    )


def _condition(conditions: list[Any], kind: str) -> PodCondition | None:
    for c in conditions:
        if c.get("type") == kind:
            status = str(c.get("status", "Unknown"))
            return PodCondition(status, c.get("reason") or "", c.get("message") or "")
    return None


def _agent_report(conditions: list[Any]) -> PodCondition | None:
    """The agent's TransferReady report. Agents always give a reason; a reason-less condition was set by
    something else (kwok's stock pod-ready stage marks every readiness gate True) and proves nothing."""
    report = _condition(conditions, naming.TRANSFER_READY)
    return report if report is not None and report.reason else None


def _termination(status: Any) -> tuple[str, str]:
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if term:
            detail = f"{term.get('reason') or 'Terminated'} (exit code {term.get('exitCode')})"
            if term.get("message"):
                detail += f": {term['message']}"
            return term.get("finishedAt") or "", detail
    return "", status.get("reason") or status.get("message") or ""


def pod_from_body(body: Any) -> PodView:
    meta, status = body["metadata"], body.get("status") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    conditions = status.get("conditions") or []
    ready = _condition(conditions, "Ready")
    scheduled = _condition(conditions, "PodScheduled")
    unschedulable = (f"{scheduled.reason}: {scheduled.message}" if scheduled is not None
                     and scheduled.status == "False" and scheduled.reason == "Unschedulable" else "")
    finished = status.get("phase") in ("Failed", "Succeeded")
    finished_at, failure = _termination(status) if finished else ("", "")
    return PodView(
        name=meta["name"],
        role="decode" if labels.get(naming.LABEL_ROLE) == "decode" else "prefill",
        index=int(labels.get(naming.LABEL_INDEX, "0")),
        generation=labels.get(naming.LABEL_GENERATION, ""),
        uid=meta.get("uid", ""),
        phase=status.get("phase") or "Pending",
        deleting=bool(meta.get("deletionTimestamp")),
        ready=ready is not None and ready.status == "True",
        transfer=_agent_report(conditions),
        refusals=_condition(conditions, naming.PEER_REFUSALS),
        finished_at=finished_at,
        failure=failure,
        restarts=int(annotations.get(naming.ANNOTATION_RESTARTS, "0")),
        unschedulable=unschedulable,
    )


def child_from_body(kind: str, body: Any) -> ChildView:
    meta = body["metadata"]
    return ChildView(
        kind=kind,
        name=meta["name"],
        generation=(meta.get("labels") or {}).get(naming.LABEL_GENERATION, ""),
        render_hash=(meta.get("annotations") or {}).get(naming.ANNOTATION_RENDER_HASH, ""),
        deleting=bool(meta.get("deletionTimestamp")),
    )
