"""Status rules: conditions derived from pods, transition times that move only on a flip, Events."""

from __future__ import annotations

from operator_world import make_owner, serving
from pdpair_operator.observe import PodCondition, PodView
from pdpair_operator.status import Cond as C
from pdpair_operator.status import (
    RolloutFacts,
    build_status,
    derive_conditions,
    merge_conditions,
    transfer_condition,
    transition_events,
)

DESIRED = {"prefill": 1, "decode": 1}


def pods(*, transfer: tuple[str, str] | None = ("True", "Ok")) -> list[PodView]:
    out = []
    for role in ("prefill", "decode"):
        pod = serving(PodView(f"x-{role}-0", role, 0, "g"))
        if transfer is None:
            pod = PodView(pod.name, role, 0, "g", phase="Running", ready=True)
        else:
            pod = PodView(pod.name, role, 0, "g", phase="Running", ready=True,
                          transfer=PodCondition(transfer[0], transfer[1], "detail"))
        out.append(pod)
    return out


def by_type(conds: list[C]) -> dict[str, C]:
    return {c.type: c for c in conds}


def test_all_serving_is_ready_and_transfer_ready() -> None:
    conds = by_type(derive_conditions(pods(), DESIRED, RolloutFacts()))
    assert (conds["Ready"].status, conds["Ready"].reason) == ("True", "AllReplicasReady")
    assert conds["TransferReady"].status == "True"
    assert (conds["Progressing"].status, conds["Degraded"].status) == ("False", "False")


def test_no_reports_yet_is_transfer_unknown() -> None:
    cond = transfer_condition(pods(transfer=None), DESIRED)
    assert (cond.status, cond.reason) == ("Unknown", "AwaitingHandshake")


def test_any_false_report_wins_with_its_reason() -> None:
    cond = transfer_condition(pods(transfer=("False", "SchemaMismatch")), DESIRED)
    assert (cond.status, cond.reason) == ("False", "SchemaMismatch")
    assert "detail" in cond.message


def test_old_pods_mean_rolling_out() -> None:
    conds = by_type(derive_conditions(pods(), DESIRED, RolloutFacts(old_pods=2)))
    assert (conds["Ready"].status, conds["Ready"].reason) == ("False", "RollingOut")
    assert (conds["Progressing"].status, conds["Progressing"].reason) == ("True", "RollingOut")


def test_transition_time_moves_only_when_status_flips() -> None:
    first = merge_conditions([], [C("Ready", "False", "A")], generation=1, now="t1")
    same = merge_conditions(first, [C("Ready", "False", "B", "other reason")], generation=2, now="t2")
    flipped = merge_conditions(same, [C("Ready", "True", "C")], generation=2, now="t3")
    assert first[0]["lastTransitionTime"] == "t1"
    assert same[0]["lastTransitionTime"] == "t1" and same[0]["reason"] == "B"
    assert same[0]["observedGeneration"] == 2
    assert flipped[0]["lastTransitionTime"] == "t3"


def test_build_status_counts_and_endpoint() -> None:
    owner = make_owner(p=1, d=1, generation=7)
    status = build_status(owner, "g", pods(), RolloutFacts(), [], "t")
    assert status["observedGeneration"] == 7
    assert status["prefill"] == {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1,
                                 "desiredReplicas": 1, "ready": "1/1"}
    assert status["bootstrapEndpoint"] == "demo-bootstrap-g.ns.svc:8998"
    assert {c["type"] for c in status["conditions"]} == {"Ready", "Progressing", "Degraded", "TransferReady",
                                                         "PeersRefused", "InvalidSpec"}


def test_events_only_for_flips_worth_attention() -> None:
    owner = make_owner(p=1, d=1)
    before = build_status(owner, "g", pods(transfer=None), RolloutFacts(), [], "t1")
    after = build_status(owner, "g", pods(), RolloutFacts(), [], "t2")
    assert transition_events({}, before) == []
    assert [e[1] for e in transition_events(before, after)] == ["ReadyTrue", "TransferReadyTrue"]
    assert transition_events(after, after) == []
    broken = build_status(owner, "g", pods(transfer=("False", "SchemaMismatch")), RolloutFacts(), [], "t3")
    kinds = [(e[0], e[1]) for e in transition_events(after, broken)]
    assert ("Warning", "TransferReadyFalse") in kinds and ("Warning", "DegradedTrue") in kinds
