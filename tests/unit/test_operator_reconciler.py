"""The work loop without kopf or a cluster: coalescing kicks, one pass at a time, forgetting deleted
PDPairs, retry on failed steps, and the CLI's help text."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from operator_world import make_owner
from pdpair_operator.apply import StepError
from pdpair_operator.cli import build_parser
from pdpair_operator.metrics import OperatorMetrics
from pdpair_operator.observe import Owner
from pdpair_operator.planner import Plan
from pdpair_operator.reconciler import Reconciler


class FakeExecutor:
    def __init__(self, fail: bool = False) -> None:
        self.plans: list[Plan] = []
        self.fail = fail
        self.active = 0
        self.max_active = 0

    async def apply(self, owner: Owner, plan: Plan, now_iso: str) -> list[StepError]:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        await asyncio.sleep(0.01)
        self.plans.append(plan)
        self.active -= 1
        return [StepError("create", "Pod/x", "boom")] if self.fail else []


def reconciler(executor: FakeExecutor, owners: dict[Any, list[Owner]]) -> Reconciler:
    rec = Reconciler(executor, OperatorMetrics(), debounce=0.01)  # type: ignore[arg-type]
    rec.indices.owners = owners
    return rec


def test_burst_of_kicks_costs_few_serial_passes() -> None:
    async def run() -> FakeExecutor:
        ex = FakeExecutor()
        rec = reconciler(ex, {("ns", "demo"): [make_owner()]})
        for _ in range(50):
            rec.kick(("ns", "demo"))
            await asyncio.sleep(0)
        await asyncio.sleep(0.2)
        return ex

    ex = asyncio.run(run())
    assert 1 <= len(ex.plans) <= 2
    assert ex.max_active == 1
    assert len(ex.plans[0].creates) == 10


def test_deleted_pdpair_is_forgotten_without_api_calls() -> None:
    async def run() -> tuple[FakeExecutor, Reconciler]:
        ex = FakeExecutor()
        rec = reconciler(ex, {})
        rec.kick(("ns", "gone"))
        await asyncio.sleep(0.1)
        return ex, rec

    ex, rec = asyncio.run(run())
    assert ex.plans == []
    assert rec.metrics.reconciles.labels("gone")._value.get() == 1


def test_failed_steps_requeue_with_backoff() -> None:
    async def run() -> FakeExecutor:
        ex = FakeExecutor(fail=True)
        rec = reconciler(ex, {("ns", "demo"): [make_owner()]})
        rec.kick(("ns", "demo"))
        await asyncio.sleep(0.8)
        return ex

    ex = asyncio.run(run())
    assert len(ex.plans) >= 2


def test_cli_help_documents_scope_metrics_and_log_format(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    for flag in ("--namespace", "--all-namespaces", "--metrics-port", "--log-format", "--standalone"):
        assert flag in text
    args = build_parser().parse_args(["-n", "a", "-n", "b", "--log-format", "json"])
    assert args.namespace == ["a", "b"] and args.log_format == "json"
