"""PDPair's Grafana dashboards, built from :mod:`dashboards.grafana` and written into the chart.

``python -m dashboards.build`` rewrites ``charts/pdpair/dashboards/*.json``; ``--check`` exits 1 when the
committed files differ from what this module builds (a test runs it). Metric names and labels follow
``dataplane/agent/metrics.py`` and ``pdpair_operator/metrics.py``; the Prometheus panel test
(tests/integration/test_dashboards_prometheus.py) runs every query below against real agents.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dashboards.grafana import Panel, Row, Target, dashboard, query_variable

OUT_DIR = Path(__file__).resolve().parent.parent / "charts" / "pdpair" / "dashboards"
RATE = "[$__rate_interval]"
AGENT_SEL = 'role=~"$role",component=~"$component",state_type=~"$state_type",peer=~"$peer"'
ROLE_PEER = 'role=~"$role",peer=~"$peer"'


def _rate(metric: str, selector: str, by: str) -> str:
    return f"sum by ({by}) (rate({metric}{{{selector}}}{RATE}))"


def _quantile(q: float, metric: str, selector: str, by: str) -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{selector}}}{RATE})))"


def _rate_panel(title: str, metric: str, selector: str, by: str, legend: str, unit: str, description: str,
                width: int = 12) -> Panel:
    """A panel of one ``sum by (...) (rate(...))`` query."""
    return Panel(title, (Target(_rate(metric, selector, by), legend),), unit, description, width)


def _p50_p99(metric: str, selector: str, by: str, legend: str) -> tuple[Target, ...]:
    return (Target(_quantile(0.5, metric, selector, by), f"p50 {legend}"),
            Target(_quantile(0.99, metric, selector, by), f"p99 {legend}"))


COMP = "component, state_type"
COMP_LEGEND = "{{component}} ({{state_type}})"
PEER_LEGEND = "{{role}} ↔ {{peer}}"


def transfer_dashboard() -> dict[str, Any]:
    """PD transfer: per component and state type, then requests and health, then per role and peer."""
    per_component = Row("Per component and state type", (
        _rate_panel("Throughput", "pdpair_agent_transfer_bytes_total", AGENT_SEL, COMP, COMP_LEGEND,
                    "Bps", "Bytes moved per second, per state component."),
        _rate_panel("Write rate", "pdpair_agent_transfer_writes_total", AGENT_SEL, COMP, COMP_LEGEND,
                    "wps", "One-sided writes issued per second (after coalescing contiguous pages)."),
        Panel("Transfer latency p50 / p99",
              _p50_p99("pdpair_agent_transfer_seconds", AGENT_SEL, COMP, COMP_LEGEND), "s",
              "Per request and component. Prefill: its writes' start to completion. Decode: transfer "
              "metadata sent to the request's completion (end to end)."),
        Panel("Bytes per request p50 / p99",
              _p50_p99("pdpair_agent_request_component_bytes", AGENT_SEL, COMP, COMP_LEGEND),
              "bytes", "Size of one request's component."),
    ))
    health = Row("Requests and health", (
        _rate_panel("Requests by outcome", "pdpair_agent_requests_total", ROLE_PEER, "role, outcome",
                    "{{role}} {{outcome}}", "reqps", "Finished requests per second."),
        _rate_panel("Failures by reason", "pdpair_agent_requests_total", ROLE_PEER + ',outcome!="success"',
                    "role, outcome, reason", "{{role}} {{outcome}}: {{reason}}",
                    "reqps", "Failed or aborted requests per second, by reason."),
        Panel("In-flight rooms",
              (Target('sum by (role) (pdpair_agent_inflight_rooms{role=~"$role"})', "{{role}}"),),
              "short", "Requests accepted and not yet finished.", width=8),
        Panel("Handshake refusals by reason",
              (Target(_rate("pdpair_agent_handshake_refusals_total", 'role=~"$role"', "role, reason"),
                      "{{role}}: {{reason}}"),),
              "short", "Peers refused at handshake (incompatible schema, version, TP layout).", width=8),
        Panel("Peers up",
              (Target(f"sum by (role, peer) (pdpair_agent_peer_up{{{ROLE_PEER}}})", "{{role}} → {{peer}}"),),
              "short", "1 while a peer is paired and alive.", width=8),
        Panel("Received bytes verified",
              (Target(_rate("pdpair_agent_verified_bytes_total",
                            'role=~"$role",component=~"$component",state_type=~"$state_type"',
                            "component, result"), "{{component}} {{result}}"),),
              "Bps", "Bytes checked against the synthetic content on decode: ok or mismatch."),
        _rate_panel("Transfer errors by kind", "pdpair_agent_transfer_errors_total", 'role=~"$role"',
                    "role, kind", "{{role}}: {{kind}}", "short",
                    "Errors on the transfer path: the transport (NIXL / MoRI-IO / CUDA IPC), a peer "
                    "gone, the agent itself."),
        _rate_panel("Role-worker CPU", "pdpair_agent_worker_cpu_seconds_total", 'role=~"$role"',
                    "role, instance", "{{role}} {{instance}}", "percentunit",
                    "Share of one core the agent's role-worker thread uses. One thread plans, posts and "
                    "accounts every room: near 100% the agent, not the engine, limits throughput."),
    ))
    per_peer = Row("Per role and peer", (
        _rate_panel("Throughput by role and peer", "pdpair_agent_transfer_bytes_total", AGENT_SEL,
                    "role, peer", PEER_LEGEND, "Bps", "Bytes/s between each agent and each peer.", 8),
        _rate_panel("Write rate by role and peer", "pdpair_agent_transfer_writes_total", AGENT_SEL,
                    "role, peer", PEER_LEGEND, "wps", "Writes/s between each agent and each peer.", 8),
        Panel("Latency p99 by role and peer",
              (Target(_quantile(0.99, "pdpair_agent_transfer_seconds", AGENT_SEL, "role, peer"),
                      "p99 {{role}} ↔ {{peer}}"),),
              "s", "Slowest 1% of component transfers, per peer (decode: end to end).", width=8),
    ))
    bytes_metric = "pdpair_agent_transfer_bytes_total"
    variables = [
        query_variable("role", "Role", "label_values(pdpair_agent_info, role)"),
        query_variable("component", "Component", f'label_values({bytes_metric}{{role=~"$role"}}, component)'),
        query_variable("state_type", "State type",
                       f'label_values({bytes_metric}{{role=~"$role",component=~"$component"}}, state_type)'),
        query_variable("peer", "Peer", f'label_values({bytes_metric}{{role=~"$role"}}, peer)'),
    ]
    return dashboard("pdpair-transfer", "PDPair / PD transfer",
                     "Prefill→decode state transfer per component and state type, per role and peer.",
                     variables, (per_component, health, per_peer))


OP_SEL = 'instance=~"$instance"'


def operator_dashboard() -> dict[str, Any]:
    """The operator: reconciles, errors, reconcile latency, API writes, PDPairs by condition."""
    reconciles = Row("Reconciles", (
        _rate_panel("Reconciles by result", "pdpair_operator_reconcile_total", OP_SEL, "result", "{{result}}",
                    "ops", "Reconcile passes per second, by result.", width=8),
        _rate_panel("Reconcile errors by step", "pdpair_operator_reconcile_errors_total", OP_SEL, "step",
                    "{{step}}", "ops", "API steps that failed during reconcile, per second.", width=8),
        Panel("Reconcile duration p50 / p99",
              _p50_p99("pdpair_operator_reconcile_duration_seconds", OP_SEL, "instance", "{{instance}}"),
              "s", "Time of one reconcile pass.", width=8),
    ))
    status = Row("PDPairs and API writes", (
        Panel("PDPairs by condition",
              (Target(f"sum by (condition, status) (pdpair_operator_pdpairs{{{OP_SEL}}})",
                      "{{condition}}={{status}}"),),
              "short", "PDPairs per status condition and status, as `kubectl get pdpairs` shows them."),
        _rate_panel("API writes by action", "pdpair_operator_api_requests_total", OP_SEL, "action",
                    "{{action}}", "ops", "Creates, patches and deletes issued by reconcile plans."),
    ))
    variables = [query_variable("instance", "Operator instance",
                                "label_values(pdpair_operator_reconcile_total, instance)")]
    return dashboard("pdpair-operator", "PDPair / Operator",
                     "The PDPair operator: reconciles, errors, latency, API writes and PDPairs by condition.",
                     variables, (reconciles, status))


DASHBOARDS = {"pdpair-transfer.json": transfer_dashboard, "pdpair-operator.json": operator_dashboard}


def render(name: str) -> str:
    return json.dumps(DASHBOARDS[name](), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON is stale")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    stale = []
    for name in DASHBOARDS:
        path, text = args.out / name, render(name)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("stale dashboards (run `python -m dashboards.build`): " + ", ".join(stale), file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
