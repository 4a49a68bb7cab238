"""The agent's readiness reporter: patches only on change, transition time only on flips, never raises."""

from __future__ import annotations

from typing import Any

from dataplane.podstatus import CONDITION_TYPE, PodStatusReporter


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.fail = fail

    def __call__(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        if self.fail:
            raise ConnectionError("api server down")
        self.calls.append((namespace, name, body))


def ticking() -> Any:
    times = iter(f"t{i}" for i in range(100))
    return lambda: next(times)


def cond(call: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    [c] = call[2]["status"]["conditions"]
    return c


def test_reports_once_per_change_and_moves_transition_only_on_flip() -> None:
    rec = Recorder()
    reporter = PodStatusReporter("ns", "pod-0", patcher=rec, clock=ticking())
    assert reporter.report(False, "AwaitingPeer", "waiting for decode")
    assert not reporter.report(False, "AwaitingPeer", "waiting for decode")
    assert reporter.report(False, "Handshaking", "")
    assert reporter.report(True, "HandshakeComplete", "schema ok")
    assert [cond(c)["status"] for c in rec.calls] == ["False", "False", "True"]
    assert [cond(c)["lastTransitionTime"] for c in rec.calls] == ["t0", "t0", "t1"]
    assert cond(rec.calls[0])["type"] == CONDITION_TYPE
    assert rec.calls[0][:2] == ("ns", "pod-0")


def test_errors_are_logged_not_raised_and_retried_next_time() -> None:
    rec = Recorder(fail=True)
    reporter = PodStatusReporter("ns", "pod-0", patcher=rec)
    assert reporter.report(False, "SchemaMismatch", "x") is False
    rec.fail = False
    assert reporter.report(False, "SchemaMismatch", "x") is True
