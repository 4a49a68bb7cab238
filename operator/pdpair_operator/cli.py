"""``pdpair-operator``: run the PDPair operator against the current kubeconfig (or in-cluster config).

A thin wrapper over ``kopf.run``: parses options once, checks that the API server answers
(``preflight``: one line and exit 1 when it does not), configures logging, imports the handlers (which
register themselves with kopf) and hands the options to them through kopf's ``memo``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

import kopf

from dataplane.commands.args import Parser, add_version, integer, number

from .identity import DEFAULT_AGENT_CLUSTER_ROLE
from .options import Options
from .preflight import NotConnected, check_api_server

LOG_FORMATS = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="pdpair-operator",
        description="Reconcile PDPair resources (pdpair.io/v1alpha1) into prefill/decode pods, Services and "
                    "agent ConfigMaps. Uses the current kubeconfig, or the in-cluster service account.")
    add_version(p)
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], metavar="NS",
                       help="watch only this namespace (repeatable; glob patterns such as 'team-*' allowed)")
    scope.add_argument("-A", "--all-namespaces", action="store_true",
                       help="watch every namespace (the default when no --namespace is given)")
    p.add_argument("--metrics-port", type=integer(0, 65535), default=8080,
                   help="serve Prometheus metrics on this port, 0 to 65535 (0 disables; default 8080)")
    p.add_argument("--metrics-address", default="127.0.0.1",
                   help="address the metrics endpoint binds (default 127.0.0.1; use the pod IP in a cluster)")
    p.add_argument("--log-format", choices=sorted(LOG_FORMATS), default="full",
                   help="plain: message only; full: time, logger and level; json: one JSON object per line")
    p.add_argument("--standalone", action="store_true",
                   help="no peering with other operator instances (kopf peering off)")
    p.add_argument("--liveness", metavar="URL", default=None,
                   help="kopf liveness endpoint, e.g. http://127.0.0.1:8081/healthz")
    p.add_argument("--concurrency", type=integer(1, 1024), default=24,
                   help="API requests in flight, 1 to 1024 (default 24)")
    p.add_argument("--connect-timeout", type=number(0.1, 3600), default=30.0, metavar="SECONDS",
                   help="at start, wait this long for the API server to answer, then exit with the "
                   "reason (default 30)")
    p.add_argument("--metrics-scraper", metavar="JSON", type=_scraper, default=None,
                   help="a NetworkPolicyPeer (JSON: namespaceSelector and/or podSelector) that each "
                        "PDPair's NetworkPolicy admits to the agents' metrics port (default: pods labelled "
                        "app.kubernetes.io/name=prometheus in any namespace)")
    p.add_argument("--agent-cluster-role", default=DEFAULT_AGENT_CLUSTER_ROLE, metavar="NAME",
                   help="the ClusterRole each PDPair's agent ServiceAccount is bound to in its namespace "
                        "(get pods, get and patch pods/status; the Helm chart's <release>-agent; "
                        "default pdpair-agent)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    return p


SCRAPER_KEYS = frozenset({"namespaceSelector", "podSelector"})


def _scraper(text: str) -> dict[str, Any]:
    """``--metrics-scraper``: a JSON object with namespaceSelector and/or podSelector (label selectors)."""
    try:
        peer = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not JSON: {text!r}; give a NetworkPolicyPeer such as "
            '{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}') from None
    if (not isinstance(peer, dict) or not peer or not set(peer) <= SCRAPER_KEYS
            or not all(isinstance(v, dict) for v in peer.values())):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a JSON object with namespaceSelector and/or podSelector (label selectors)")
    return peer


def options_from(args: argparse.Namespace) -> Options:
    return Options(metrics_port=args.metrics_port, metrics_address=args.metrics_address,
                   concurrency=args.concurrency, metrics_scraper=args.metrics_scraper,
                   agent_cluster_role=args.agent_cluster_role)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_api_server(args.connect_timeout)
    except NotConnected as exc:
        print(f"pdpair-operator: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    kopf.configure(verbose=args.verbose, quiet=args.quiet, log_format=LOG_FORMATS[args.log_format])
    if not args.verbose:
        # kopf logs every event handler's success at INFO: one line per pod event at scale.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    from . import handlers  # noqa: F401  (registers the handlers with kopf's default registry)

    try:
        kopf.run(
            standalone=args.standalone or None,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=args.liveness,
            memo=kopf.Memo(options=options_from(args)),
        )
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
