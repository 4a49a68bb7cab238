"""Table tests for the operator's pure planner: each case is a named situation and what must follow."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec
import pytest
from operator_world import T0, World, make_owner, serving
from pdpair_operator import naming
from pdpair_operator.observe import ChildView, PodCondition, PodView
from pdpair_operator.planner import Observed, Plan, backoff_seconds, plan, rfc3339
from pdpair_operator.spec import generation_hash


def settled(**spec: Any) -> World:
    """A world where every child of the spec exists and every pod serves."""
    world = World(make_owner(**spec))
    world.step()
    world.run()
    world.step()
    return world


def names(manifests: tuple[dict[str, Any], ...], kind: str = "Pod") -> list[str]:
    return [m["metadata"]["name"] for m in manifests if m["kind"] == kind]


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_fresh_create_makes_every_child() -> None:
    world = World(make_owner(p=1, d=2))
    gen = generation_hash(world.owner.spec)
    result = world.step()
    assert names(result.creates) == [f"demo-{gen}-prefill-0", f"demo-{gen}-decode-0", f"demo-{gen}-decode-1"]
    assert sorted(names(result.creates, "Service")) == sorted(
        [f"demo-bootstrap-{gen}", "demo-pods", "demo-metrics"])
    assert names(result.creates, "ConfigMap") == [f"demo-agent-{gen}"]
    assert result.deletes == ()
    assert result.status is not None and cond(result.status, "Ready")["reason"] == "ReplicasNotReady"
    assert cond(result.status, "Progressing")["status"] == "True"


def test_settled_pair_plans_nothing() -> None:
    world = settled(p=1, d=1)
    result = world.step()
    assert (result.creates, result.deletes, result.patches, result.status) == ((), (), (), None)
    assert cond(world.owner.status, "Ready")["status"] == "True"
    assert cond(world.owner.status, "Progressing")["reason"] == "Complete"


def test_scale_up_adds_only_missing_indices_without_rollout() -> None:
    world = settled(p=1, d=1)
    gen = generation_hash(world.owner.spec)
    world.spec_change(p=3, d=1)
    result = world.step()
    assert generation_hash(world.owner.spec) == gen
    assert names(result.creates) == [f"demo-{gen}-prefill-1", f"demo-{gen}-prefill-2"]
    assert result.deletes == ()


def test_scale_down_deletes_highest_index_first() -> None:
    world = settled(p=4, d=1)
    gen = generation_hash(world.owner.spec)
    world.spec_change(p=2, d=1)
    result = world.step()
    assert [d.name for d in result.deletes] == [f"demo-{gen}-prefill-3", f"demo-{gen}-prefill-2"]
    assert all(d.uid for d in result.deletes)


def test_scale_change_patches_the_agent_config() -> None:
    world = settled(p=1, d=1)
    world.spec_change(p=1, d=2)
    result = world.step()
    assert [p.name for p in result.patches] == [f"demo-agent-{generation_hash(world.owner.spec)}"]


def test_scale_to_zero_removes_pods_and_reports_it() -> None:
    world = settled(p=2, d=2)
    world.spec_change(p=0, d=0)
    result = world.step()
    assert len([d for d in result.deletes if d.kind == "Pod"]) == 4
    world.step()
    assert cond(world.owner.status, "Ready")["reason"] == "ScaledToZero"


def test_deleted_pod_is_replaced_at_once() -> None:
    world = settled(p=2, d=1)
    victim = sorted(world.pods)[0]
    del world.pods[victim]
    result = world.step()
    assert names(result.creates) == [victim]
    assert result.creates[0]["metadata"]["annotations"][naming.ANNOTATION_RESTARTS] == "0"


def test_terminating_pod_is_not_recreated_under_its_feet() -> None:
    world = settled(p=1, d=1)
    victim = sorted(world.pods)[0]
    world.pods[victim] = msgspec.structs.replace(world.pods[victim], deleting=True)
    result = world.step()
    assert names(result.creates) == []


def _fail(world: World, name: str, when: str = "") -> None:
    world.pods[name] = msgspec.structs.replace(
        world.pods[name], phase="Failed", ready=False, failure="Error (exit code 3): boom",
        finished_at=when or rfc3339(world.now))


def test_failed_pod_is_recorded_deleted_and_reported() -> None:
    world = settled(p=1, d=1)
    victim = sorted(world.pods)[0]
    uid = world.pods[victim].uid
    _fail(world, victim)
    result = world.step()
    assert [(d.name, d.uid) for d in result.deletes] == [(victim, uid)]
    assert result.status is not None
    [record] = result.status["failures"]
    assert (record["pod"], record["count"], record["reason"]) == (victim, 1, "Error (exit code 3): boom")
    assert [e.reason for e in result.events if e.type == "Warning"][:1] == ["PodFailed"]


def test_failed_slot_waits_out_its_backoff() -> None:
    world = settled(p=1, d=1)
    victim = sorted(world.pods)[0]
    _fail(world, victim)
    world.step(0)
    result = world.step(2)
    assert names(result.creates) == []
    assert result.requeue_after == pytest.approx(backoff_seconds(1) - 2)
    assert cond(world.owner.status, "Degraded")["reason"] == "PodsFailing"
    assert cond(world.owner.status, "Ready")["reason"] == "PodsFailing"


def test_failed_slot_is_refilled_after_backoff_with_crash_context() -> None:
    world = settled(p=1, d=1)
    victim = sorted(world.pods)[0]
    _fail(world, victim)
    world.step(0)
    result = world.step(backoff_seconds(1) + 1)
    assert names(result.creates) == [victim]
    annotations = result.creates[0]["metadata"]["annotations"]
    assert annotations[naming.ANNOTATION_RESTARTS] == "1"
    assert "exit code 3" in annotations[naming.ANNOTATION_LAST_FAILURE]


def test_repeated_failures_grow_the_backoff() -> None:
    world = settled(p=1, d=1)
    victim = sorted(world.pods)[0]
    for count in (1, 2, 3):
        _fail(world, victim)
        world.step(0)
        record = next(r for r in world.owner.status["failures"] if r["pod"] == victim)
        assert record["count"] == count
        world.step(backoff_seconds(count) + 1)
        assert victim in world.pods
    assert backoff_seconds(3) == 4 * backoff_seconds(1)


def test_same_failure_is_counted_once() -> None:
    world = settled(p=1, d=1)
    victim = sorted(world.pods)[0]
    _fail(world, victim)
    owner = world.owner
    first = plan(owner, world.observed(), world.now)
    owner2 = msgspec.structs.replace(owner, status=first.status or owner.status)
    second = plan(owner2, world.observed(), world.now + timedelta(seconds=1))
    assert second.status is None or second.status["failures"][0]["count"] == 1


def _rollout_world(p: int, d: int, **spec: Any) -> tuple[World, str, str]:
    world = settled(p=p, d=d)
    old = generation_hash(world.owner.spec)
    world.spec_change(p=p, d=d, image="img:2", **spec)
    return world, old, generation_hash(world.owner.spec)


def test_rollout_starts_with_one_new_unit_and_keeps_old() -> None:
    world, old, new = _rollout_world(2, 4)
    result = world.step()
    assert names(result.creates) == [f"demo-{new}-prefill-0", f"demo-{new}-decode-0", f"demo-{new}-decode-1"]
    assert [d for d in result.deletes if d.kind == "Pod"] == []
    assert f"demo-bootstrap-{new}" in names(result.creates, "Service")
    assert f"demo-agent-{new}" in names(result.creates, "ConfigMap")
    assert "RolloutStarted" in [e.reason for e in result.events]
    assert cond(world.owner.status, "Ready")["reason"] == "RollingOut"
    assert world.by_gen() == {old: {"prefill": 2, "decode": 4}, new: {"prefill": 1, "decode": 2}}


def test_rollout_keeps_old_pods_while_new_are_not_ready() -> None:
    world, old, _new = _rollout_world(2, 4)
    world.step()
    for _ in range(3):
        result = world.step()
        assert [d for d in result.deletes if d.kind == "Pod"] == []
    assert world.by_gen()[old] == {"prefill": 2, "decode": 4}


def test_rollout_drops_one_old_unit_per_ready_new_unit() -> None:
    world, old, new = _rollout_world(2, 4)
    world.step()
    world.run(*[n for n, p in world.pods.items() if p.generation == new])
    result = world.step()
    deleted = [d.name for d in result.deletes if d.kind == "Pod"]
    assert deleted == [f"demo-{old}-prefill-1", f"demo-{old}-decode-3", f"demo-{old}-decode-2"]
    assert names(result.creates) == [f"demo-{new}-prefill-1", f"demo-{new}-decode-2", f"demo-{new}-decode-3"]


def test_rollout_completes_keeping_ratio_and_never_pairing_generations() -> None:
    world, old, new = _rollout_world(2, 4)
    for _ in range(10):
        world.step()
        for gen, counts in world.by_gen().items():
            assert counts["prefill"] * 2 == counts["decode"], (gen, counts)
        for role, want in (("prefill", 2), ("decode", 4)):
            serving = sum(1 for p in world.pods.values() if p.role == role and p.serving)
            assert serving >= want, f"capacity dropped: {role} {serving}/{want}"
        world.run()
    assert world.by_gen() == {new: {"prefill": 2, "decode": 4}}
    assert world.decode_peer(new) == f"demo-bootstrap-{new}.ns.svc"
    selector = world.manifests[("Service", f"demo-bootstrap-{new}")]["spec"]["selector"]
    assert selector[naming.LABEL_GENERATION] == new and selector[naming.LABEL_ROLE] == "prefill"
    assert ("ConfigMap", f"demo-agent-{old}") not in world.children
    assert ("Service", f"demo-bootstrap-{old}") not in world.children
    reasons = [e.reason for r in world.history for e in r.events]
    assert "RolloutComplete" in reasons
    assert cond(world.owner.status, "Ready")["status"] == "True"


def test_rollout_with_coprime_ratio_is_blue_green() -> None:
    world, old, new = _rollout_world(1, 3)
    world.step()
    assert world.by_gen() == {old: {"prefill": 1, "decode": 3}, new: {"prefill": 1, "decode": 3}}
    world.run(*[n for n, p in world.pods.items() if p.generation == new][:3])
    result = world.step()
    assert [d for d in result.deletes if d.kind == "Pod"] == []


def test_operator_restart_mid_rollout_replans_the_same_without_duplicates() -> None:
    world, _old, _new = _rollout_world(2, 4)
    world.step()
    remembered = plan(world.owner, world.observed(), world.now)
    amnesiac = msgspec.structs.replace(world.owner, status={})
    fresh = plan(amnesiac, world.observed(), world.now)
    assert names(fresh.creates) == names(remembered.creates) == []
    assert fresh.deletes == remembered.deletes == ()
    present = set(world.pods)
    assert not present & set(names(fresh.creates))


def test_recreate_strategy_empties_old_generation_first() -> None:
    world, old, new = _rollout_world(1, 1, strategy="Recreate")
    result = world.step()
    assert names(result.creates) == []
    assert sorted(d.name for d in result.deletes if d.kind == "Pod") == sorted(
        n for n, p in world.pods.items() if p.generation == old) or world.by_gen() == {}
    result = world.step()
    assert len(names(result.creates)) == 2 and world.by_gen() == {new: {"prefill": 1, "decode": 1}}


def test_children_of_dead_generations_are_deleted_and_live_ones_kept() -> None:
    world = settled(p=1, d=1)
    gen = generation_hash(world.owner.spec)
    stray = ChildView("ConfigMap", "demo-agent-deadbeef", generation="deadbeef")
    world.children[("ConfigMap", stray.name)] = stray
    result = world.step()
    assert [(d.kind, d.name) for d in result.deletes] == [("ConfigMap", "demo-agent-deadbeef")]
    assert ("ConfigMap", f"demo-agent-{gen}") in world.children


def test_deleted_service_is_recreated() -> None:
    world = settled(p=1, d=1)
    del world.children[("Service", "demo-metrics")]
    result = world.step()
    assert names(result.creates, "Service") == ["demo-metrics"]


def test_schema_mismatch_is_transfer_ready_false_with_agent_reason() -> None:
    world = settled(p=1, d=1)
    decode = next(n for n, p in world.pods.items() if p.role == "decode")
    world.pods[decode] = msgspec.structs.replace(
        world.pods[decode], ready=False,
        transfer=PodCondition("False", "SchemaMismatch", "component 1: mamba vs swa"))
    result = world.step()
    assert result.status is not None
    transfer = cond(result.status, "TransferReady")
    assert (transfer["status"], transfer["reason"]) == ("False", "SchemaMismatch")
    assert "mamba vs swa" in transfer["message"] and decode in transfer["message"]
    assert cond(result.status, "Ready")["reason"] == "TransferNotReady"
    assert cond(result.status, "Degraded")["status"] == "True"
    assert ("Warning", "TransferReadyFalse") in [(e.type, e.reason) for e in result.events]


def test_plan_is_deterministic_for_a_stale_replay() -> None:
    owner = make_owner(p=2, d=2)
    observed = Observed((PodView("x", "prefill", 9, "0000"),), ())
    first: Plan = plan(owner, observed, T0, new_key=lambda: bytes(32))
    assert plan(owner, observed, T0, new_key=lambda: bytes(32)) == first


def test_old_generation_failed_pod_is_not_replaced() -> None:
    world, old, new = _rollout_world(1, 1)
    world.step()
    victim = next(n for n, p in world.pods.items() if p.generation == old and p.role == "decode")
    _fail(world, victim)
    world.step()
    world.step(backoff_seconds(5))
    assert victim not in world.pods
    world.run()
    world.step()
    world.step()
    assert world.by_gen() == {new: {"prefill": 1, "decode": 1}}


def test_serving_requires_the_agents_transfer_report() -> None:
    pod = PodView("p", "prefill", 0, "g", phase="Running", ready=True)
    assert not pod.serving
    assert serving(pod).serving


def test_rollout_waves_create_decode_before_prefill_and_delete_prefill_first() -> None:
    """An operator stopped between two waves leaves no generation with prefill but no decode."""
    world, old, new = _rollout_world(2, 4)
    first = world.step()
    waves = first.create_waves()
    assert [names(w) for w in waves] == [
        [], [f"demo-{new}-decode-0", f"demo-{new}-decode-1"], [f"demo-{new}-prefill-0"]]
    assert f"demo-bootstrap-{new}" in names(waves[0], "Service")
    world.run(*[n for n, p in world.pods.items() if p.generation == new])
    second = world.step()
    assert [[d.name for d in w if d.kind == "Pod"] for w in second.delete_waves()] == [
        [f"demo-{old}-prefill-1"], [f"demo-{old}-decode-3", f"demo-{old}-decode-2"]]


class _FailingDecodeCreates:
    """An API server that refuses decode pods: the executor must then not create prefill pods."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def request(self, method: str, path: str, body: Any = None, *args: Any, **kwargs: Any) -> Any:
        name = (body or {}).get("metadata", {}).get("name", path.rsplit("/", 1)[-1])
        self.calls.append((method, name))
        if method == "POST" and "-decode-" in name:
            from pdpair_operator.apply import KubeError

            raise KubeError(500, "etcd is unhappy")
        return {}


def test_executor_stops_at_a_failed_wave() -> None:
    import asyncio

    from pdpair_operator.apply import Executor

    world, _old, new = _rollout_world(2, 4)
    step = world.step()
    api = _FailingDecodeCreates()
    errors = asyncio.run(Executor(api, concurrency=4).apply(  # type: ignore[arg-type]
        world.owner, step, "2026-01-01T00:00:00Z"))
    assert {e.target for e in errors} == {f"Pod/demo-{new}-decode-0", f"Pod/demo-{new}-decode-1"}
    posted = [n for m, n in api.calls if m == "POST"]
    assert f"demo-{new}-prefill-0" not in posted and f"demo-{new}-decode-0" in posted
