"""The operator dashboard against real data: the operator reconciles PDPairs on the real control plane
while Debian's Prometheus scrapes it; one namespace has a ResourceQuota of zero pods, so its PDPair's
pod creates keep failing (the errors panel has something real to show). Every panel's query, variables
filled from ``label_values()``, must return plausible series; a panel that returns nothing fails."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from dashboards import build
from dashboards.grafana import panels_of
from devcluster import Cluster
from tests.chart_support import CRDS, Operator, pdpair
from tests.prom_support import Prometheus, prometheus, resolve_variables, save_panel_data, substitute

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BOARD = build.operator_dashboard()
Series = list[dict[str, Any]]


@dataclass
class Run:
    prom: Prometheus
    start: float
    end: float


@pytest.fixture(scope="module")
def operator_traffic(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    workdir = tmp_path_factory.mktemp("opdash")
    uid = uuid.uuid4().hex[:6]
    ok_ns, quota_ns = f"opdash-{uid}", f"opdash-{uid}-quota"
    cluster.kubectl("apply", "-f", str(CRDS))
    for ns in (ok_ns, quota_ns):
        cluster.kubectl("create", "namespace", ns)
        cluster.kubectl("create", "serviceaccount", "pdpair-agent", "-n", ns)
    cluster.apply([{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods", "namespace":
                    quota_ns}, "spec": {"hard": {"pods": "0"}}}])
    operator = Operator(cluster.kubeconfig, ok_ns, workdir / "operator.log", f"--namespace={quota_ns}")
    try:
        jobs = {"pdpair-operator": [f"127.0.0.1:{operator.metrics_port}"]}
        with prometheus(workdir / "prometheus", jobs) as prom:
            prom.wait_until("operator scraped", lambda: set(prom.targets_up().values()) == {"up"}, 60)
            start = time.time()
            cluster.apply([pdpair("steady", ok_ns), pdpair("starved", quota_ns)])
            for replicas in (2, 1):
                time.sleep(5)
                cluster.kubectl("patch", "pdpair", "steady", "-n", ok_ns, "--type=merge",
                                "-p", f'{{"spec":{{"decode":{{"replicas":{replicas}}}}}}}')
            time.sleep(8)
            yield Run(prom, start, time.time())
    finally:
        operator.stop()
        for ns in (ok_ns, quota_ns):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def by_label(series: Series, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in series:
        vals = [float(v) for _, v in s["values"] if not math.isnan(float(v))]
        if vals:
            out[s["metric"].get(label, "")] = max(out.get(s["metric"].get(label, ""), 0.0), max(vals))
    return out


def _reconciles(series: list[Series]) -> None:
    assert by_label(series[0], "result").get("ok", 0) > 0


def _errors(series: list[Series]) -> None:
    assert by_label(series[0], "step").get("create", 0) > 0, series


def _duration(series: list[Series]) -> None:
    p50, p99 = (max(by_label(s, "instance").values()) for s in series)
    assert 0 < p50 <= p99 < 10


def _conditions(series: list[Series]) -> None:
    """Each condition type counts both PDPairs (its True, False and Unknown add up to 2)."""
    last: dict[str, float] = {}
    for s in series[0]:
        last[s["metric"]["condition"]] = last.get(s["metric"]["condition"], 0.0) + float(s["values"][-1][1])
    assert last and all(v == 2 for v in last.values()), last


def _writes(series: list[Series]) -> None:
    assert by_label(series[0], "action").get("create", 0) > 0


CHECKS: dict[str, Callable[[list[Series]], None]] = {
    "Reconciles by result": _reconciles,
    "Reconcile errors by step": _errors,
    "Reconcile duration p50 / p99": _duration,
    "PDPairs by condition": _conditions,
    "API writes by action": _writes,
}


def test_every_operator_panel_has_a_plausibility_check() -> None:
    assert {p["title"] for p in panels_of(BOARD)} == set(CHECKS)


@pytest.mark.parametrize("title", list(CHECKS))
def test_operator_panel_returns_plausible_data(operator_traffic: Run, title: str) -> None:
    run = operator_traffic
    (panel,) = [p for p in panels_of(BOARD) if p["title"] == title]
    values = resolve_variables(run.prom, BOARD, run.start, run.end)
    assert values["instance"], "the instance variable found no operator"
    results = []
    for target in panel["targets"]:
        expr = substitute(target["expr"], values)
        series = run.prom.query_range(expr, run.start, run.end)
        assert series, f"panel {title!r} returned nothing for {expr}"
        results.append(series)
    CHECKS[title](results)
    save_panel_data(BOARD["uid"], panel, results, run.start)

