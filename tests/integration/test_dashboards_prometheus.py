"""Every dashboard panel against real data: Debian's Prometheus scrapes a real prefill/decode agent pair
(NIXL moving real bytes on loopback) while the synthetic stream flows, plus the faults some panels
exist for (an incompatible decode that is refused; a decode killed mid-transfer). Then every panel's
query, with its variables filled from their own ``label_values()`` queries, must return series with
plausible values — a panel that returns nothing fails. The operator dashboard is checked the same way
in tests/e2e/test_operator_dashboard.py (it needs the control plane). With PDPAIR_DASHBOARD_DATA=DIR the
query results are kept for ``python -m dashboards.render`` (the PNGs in docs/img/)."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import build
from dashboards.grafana import panels_of
from dataplane.config import parse_config
from dataplane.harness.agent_processes import pairing_key_file
from dataplane.harness.waiting import wait_for
from dataplane.schema.profiles import schema_from_config
from tests.prom_support import (
    Prometheus,
    free_port,
    prometheus,
    resolve_variables,
    save_panel_data,
    substitute,
)

pytestmark = [pytest.mark.nixl, pytest.mark.slow]

AGENT = str(Path(sys.executable).parent / "pdpair-agent")
PROFILE = "qwen3-next"
STEADY_SECONDS = 15
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
Series = list[dict[str, Any]]


@dataclass
class Agent:
    name: str
    config: dict[str, Any]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def metrics(self) -> str:
        return f"127.0.0.1:{self.config['listen']['metricsPort']}"

    def start(self, workdir: Path) -> None:
        path = workdir / f"{self.name}.yaml"
        path.write_text(yaml.safe_dump(self.config))
        log = (workdir / f"{self.name}.log").open("ab")
        role = self.config["role"]
        self.proc = subprocess.Popen([AGENT, "run", "--role", role, "--config", str(path)],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def scrape(self) -> str:
        try:
            with _NO_PROXY.open(f"http://{self.metrics}/metrics", timeout=2) as response:
                return str(response.read().decode())
        except OSError:
            return ""

    def transferring(self) -> bool:
        """A room of this (prefill) agent has writes in flight now (its ``/status``)."""
        try:
            with _NO_PROXY.open(f"http://{self.metrics}/status", timeout=2) as response:
                rooms = json.loads(response.read())["rooms"]
        except (OSError, ValueError, KeyError):
            return False
        return bool(rooms.get("states", {}).get("Transferring"))


def agent_config(role: str, bootstrap: int, key: str, profile: str = PROFILE, peer: int | None = None,
                 ) -> dict[str, Any]:
    config: dict[str, Any] = {
        "role": role, "model": {"profile": profile}, "auth": {"keyFile": key},
        "listen": {"host": "127.0.0.1", "bootstrapPort": free_port() if peer else bootstrap,
                   "metricsPort": free_port()},
        "identity": {"pdpair": "prom-test"},
        "transfer": {"timeoutSeconds": 5, "heartbeatIntervalSeconds": 0.2, "heartbeatMisses": 5,
                     "nixl": {"ucxTls": "tcp", "ucxNetDevices": "lo"}},
    }
    if peer:
        config["peer"] = {"bootstrapHost": "127.0.0.1", "bootstrapPort": peer}
        config["synthetic"] = {"requestsPerSecond": 40, "tokens": [4096, 0, 1000, 16384], "maxInflight": 4}
    return config


@dataclass
class Run:
    prom: Prometheus
    start: float
    end: float
    components: set[str]
    workdir: Path


def counter(text: str, name: str) -> float:
    """Sum of one counter's samples in an exposition."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def rising(prom: Prometheus, selector: str, since: float) -> bool:
    """Prometheus has seen the counter go up (not merely appear: a new series has no rate)."""
    series = prom.query_range(f"sum(rate({selector}[10s]))", since, time.time())
    return any(float(v) > 0 for s in series for _, v in s["values"])


def _inject_faults(prom: Prometheus, since: float, workdir: Path, prefill: Agent, decode: Agent,
                   refused: Agent) -> None:
    """Each fault repeated, a few scrapes apart, until Prometheus saw its counter rise: an incompatible
    decode refused twice; the decode killed mid-transfer (and restarted) until failed requests and
    engine errors both rose on prefill."""
    refusals = "pdpair_agent_handshake_refusals_total"
    for n in (1.0, 2.0):
        refused.start(workdir)

        def seen(at_least: float = n) -> bool:
            return counter(prefill.scrape(), refusals) >= at_least
        wait_for(f"refused handshake #{n:.0f}", seen, 30)
        refused.stop()
        time.sleep(3)
    faults = ('pdpair_agent_requests_total{outcome!="success"}', "pdpair_agent_transfer_errors_total")
    for _ in range(8):
        _kill_mid_transfer(prefill, decode)
        time.sleep(3)
        if all(rising(prom, f, since) for f in faults):
            return
        decode.start(workdir)
        wait_for("traffic again", lambda: 'outcome="success"' in decode.scrape(), 30)
        time.sleep(2)
    raise AssertionError("killing the decode mid-transfer never made failures and engine errors rise")


def _kill_mid_transfer(prefill: Agent, decode: Agent, within: float = 5.0) -> None:
    """SIGKILL decode while one of prefill's rooms has writes in flight (an engine error on prefill
    follows only then; a kill between rooms, likely with small rooms, fails waiting rooms alone), or at
    the end of ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not prefill.transferring():
        pass
    decode.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    workdir = tmp_path_factory.mktemp("prom")
    bootstrap = free_port()
    key = pairing_key_file(workdir)
    prefill = Agent("prefill", agent_config("prefill", bootstrap, key))
    decode = Agent("decode", agent_config("decode", bootstrap, key, peer=bootstrap))
    refused = Agent("refused",
                    agent_config("decode", bootstrap, key, profile="deepseek-v3.2", peer=bootstrap))
    cfg = parse_config(json.dumps(prefill.config))
    components = {"kv", "aux", *(c.name for c in schema_from_config(cfg).components)}
    jobs = {"pdpair-agents": [prefill.metrics, decode.metrics, refused.metrics]}
    agents = (prefill, decode, refused)
    try:
        with prometheus(workdir / "prometheus", jobs) as prom:
            prefill.start(workdir)
            decode.start(workdir)
            wait_for("transfers", lambda: 'outcome="success"' in decode.scrape(), 60)
            prom.wait_until("agents scraped", lambda: list(prom.targets_up().values()).count("up") >= 2, 30)
            start = time.time()
            time.sleep(STEADY_SECONDS)
            _inject_faults(prom, start, workdir, prefill, decode, refused)
            time.sleep(4)
            yield Run(prom, start, time.time(), components, workdir)
    finally:
        for agent in agents:
            agent.stop()


def values_of(series: Series) -> list[float]:
    return [float(v) for s in series for _, v in s["values"] if not math.isnan(float(v))]


def by_label(series: Series, label: str) -> dict[str, float]:
    """Max over time of each series, keyed by one label."""
    out: dict[str, float] = {}
    for s in series:
        vals = [float(v) for _, v in s["values"] if not math.isnan(float(v))]
        if vals:
            key = s["metric"].get(label, "")
            out[key] = max(out.get(key, 0.0), max(vals))
    return out


def _positive_per_component(run: Run, series: list[Series]) -> None:
    assert {k for k, v in by_label(series[0], "component").items() if v > 0} >= run.components


def _latency(run: Run, series: list[Series]) -> None:
    p50, p99 = series
    for quantile in (p50, p99):
        assert {k for k, v in by_label(quantile, "component").items() if 0 < v < 30} >= run.components
    assert max(values_of(p99)) >= max(values_of(p50))


def _sizes(run: Run, series: list[Series]) -> None:
    assert {k for k, v in by_label(series[1], "component").items() if v > 0} >= run.components


def _outcomes(run: Run, series: list[Series]) -> None:
    assert by_label(series[0], "outcome").get("success", 0) > 0


def _failures(run: Run, series: list[Series]) -> None:
    assert {s["metric"]["outcome"] for s in series[0]} <= {"failed", "aborted"}
    assert max(values_of(series[0])) > 0


def _inflight(run: Run, series: list[Series]) -> None:
    assert set(by_label(series[0], "role")) == {"prefill", "decode"} and min(values_of(series[0])) >= 0


def _refusals(run: Run, series: list[Series]) -> None:
    assert by_label(series[0], "reason").keys() == {"model_mismatch"}, series[0]
    assert by_label(series[0], "role").get("prefill", 0) > 0


def _peers_up(run: Run, series: list[Series]) -> None:
    assert by_label(series[0], "role") == {"prefill": 1.0, "decode": 1.0}


def _verified(run: Run, series: list[Series]) -> None:
    ok = {s["metric"]["component"] for s in series[0]
          if s["metric"]["result"] == "ok" and max(values_of([s])) > 0}
    assert ok >= run.components
    assert all(max(values_of([s])) == 0 for s in series[0] if s["metric"]["result"] != "ok")


def _transfer_errors(run: Run, series: list[Series]) -> None:
    assert by_label(series[0], "role").get("prefill", 0) > 0


def _worker_cpu(run: Run, series: list[Series]) -> None:
    """A share of one core: busy while moving rooms, never above one core (plus scrape jitter)."""
    per_role = by_label(series[0], "role")
    assert {"prefill", "decode"} <= per_role.keys() and all(0 < v < 1.2 for v in per_role.values()), per_role


def _positive_per_peer(run: Run, series: list[Series]) -> None:
    assert {k for k, v in by_label(series[0], "role").items() if v > 0} == {"prefill", "decode"}


def _prefill_positive(run: Run, series: list[Series]) -> None:
    """Writes and their latency are the writer's: prefill issues every one-sided write."""
    assert by_label(series[0], "role").get("prefill", 0) > 0


CHECKS: dict[str, Callable[[Run, list[Series]], None]] = {
    "Throughput": _positive_per_component,
    "Write rate": _positive_per_component,
    "Transfer latency p50 / p99": _latency,
    "Bytes per request p50 / p99": _sizes,
    "Requests by outcome": _outcomes,
    "Failures by reason": _failures,
    "In-flight rooms": _inflight,
    "Handshake refusals by reason": _refusals,
    "Peers up": _peers_up,
    "Received bytes verified": _verified,
    "Transfer errors by kind": _transfer_errors,
    "Role-worker CPU": _worker_cpu,
    "Throughput by role and peer": _positive_per_peer,
    "Write rate by role and peer": _prefill_positive,
    "Latency p99 by role and peer": _prefill_positive,
}
TRANSFER = build.transfer_dashboard()


def test_every_transfer_panel_has_a_plausibility_check() -> None:
    assert {p["title"] for p in panels_of(TRANSFER)} == set(CHECKS)


def test_variables_resolve_to_what_the_agents_export(traffic: Run) -> None:
    values = resolve_variables(traffic.prom, TRANSFER, traffic.start, traffic.end)
    assert values["role"] == ["decode", "prefill"]
    assert set(values["component"]) >= traffic.components
    assert set(values["state_type"]) >= {"kv", "mamba"}
    assert values["peer"], values


@pytest.mark.parametrize("title", list(CHECKS))
def test_panel_returns_plausible_data(traffic: Run, title: str) -> None:
    (panel,) = [p for p in panels_of(TRANSFER) if p["title"] == title]
    values = resolve_variables(traffic.prom, TRANSFER, traffic.start, traffic.end)
    results = []
    for target in panel["targets"]:
        expr = substitute(target["expr"], values)
        series = traffic.prom.query_range(expr, traffic.start, traffic.end)
        assert series, f"panel {title!r} returned nothing for {expr}"
        results.append(series)
    CHECKS[title](traffic, results)
    save_panel_data(TRANSFER["uid"], panel, results, traffic.start)


def test_a_misnamed_metric_would_fail_its_panel(traffic: Run) -> None:
    """The panel check can fail: a one-letter slip in a metric name returns no series at all."""
    expr = substitute('sum(rate(pdpair_agent_transfer_byte_total{role=~"$role"}[$__rate_interval]))',
                      {"role": ["prefill"]})
    assert traffic.prom.query_range(expr, traffic.start, traffic.end) == []
