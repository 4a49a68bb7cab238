"""``pdpair-agent run``: what a pod runs — the agent of one role, serving every TP rank of its pod,
until SIGTERM.

The operator renders ``pdpair-agent run --role <role> --config /etc/pdpair/config/agent.yaml --listen-host
$(POD_IP) --pod-name $(POD_NAME) --namespace $(POD_NAMESPACE)``; flags override the file's fields.
The agent serves ranks 0 .. tpSize-1 of its role (``<role>.tpSize``): with its own synthetic source,
one per rank; with an external engine (``localapi.engine.mode: external``), one local API
connection per engine rank on the one socket. ``--tp-rank R`` serves rank R alone (a prefill rank
above 0 then announces itself to rank 0's bootstrap endpoint). With a pod name and namespace,
handshake outcomes are reported as the pod condition ``pdpair.io/TransferReady``, ready once every
rank is paired.

For tests and the fault matrix only: ``PDPAIR_TEST_FAULTS`` (e.g. ``rate=0.3,seed=7``) wraps the agent's
transport in ``dataplane.transports.faulty.FaultyTransport``, which fails, loses and delays writes.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any

from ..errors import BadInput
from .args import add_log_level, integer, output_file, plain

log = logging.getLogger(__name__)

FAULTS_ENV = "PDPAIR_TEST_FAULTS"
"""Injected transport faults (tests and the fault matrix only; ``transports.faulty.FaultPlan``)."""

BIND_ERRNOS = (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES)

LOG_FIELDS = ("name", "levelname", "message")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg (+ exc)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(fmt: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run",
        help="run one agent (what pods run)",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--role", choices=("prefill", "decode"), required=True)
    p.add_argument("--config", required=True, metavar="FILE", help="agent config (YAML or JSON)")
    p.add_argument("--listen-host", help="address every listener binds (overrides listen.host)")
    p.add_argument("--pod-name", help="this pod (identity.podName); enables the pod condition")
    p.add_argument("--namespace", help="this pod's namespace (identity.namespace)")
    p.add_argument("--service-account-dir", metavar="DIR",
                   help="report pod conditions with the ServiceAccount token in DIR (token, ca.crt: the "
                        "pod's projected token volume) at KUBERNETES_SERVICE_HOST/PORT; the agent exits at "
                        "once if that identity may not patch its pod's status")
    p.add_argument("--tp-rank", type=integer(0, 63),
                   help="serve this TP rank alone (default: every rank of <role>.tpSize)")
    p.add_argument("--log-format", choices=("plain", "json"), default="plain")
    add_log_level(p)
    p.add_argument("--ready-file", type=output_file, metavar="FILE",
                   help="write the bound ports here as JSON once up")
    p.set_defaults(handler=run)


def load(args: argparse.Namespace) -> Any:
    import msgspec

    from ..config import load_config

    cfg = load_config(args.config)
    ident = cfg.identity
    ident = msgspec.structs.replace(
        ident, pod_name=args.pod_name or ident.pod_name, namespace=args.namespace or ident.namespace
    )
    listen = msgspec.structs.replace(cfg.listen, host=args.listen_host or cfg.listen.host)
    tp_rank = 0 if args.tp_rank is None else args.tp_rank
    cfg = msgspec.structs.replace(cfg, role=args.role, identity=ident, listen=listen, tp_rank=tp_rank)
    cfg.check_ranks()
    return cfg


def served_ranks(cfg: Any, args: argparse.Namespace) -> list[int]:
    """The TP ranks this process serves: ``--tp-rank`` alone, else every rank of the role."""
    return list(range(cfg.tp_size)) if args.tp_rank is None else [args.tp_rank]


def pod_reporter(cfg: Any, service_account_dir: str | None = None) -> Any:
    """``PodStatusReporter`` when running in a pod (namespace and pod name known), else None. With
    ``service_account_dir``, it reports as that token's ServiceAccount, and ``BadInput`` says why that
    identity cannot (an agent that cannot report would never turn its pod Ready)."""
    ident = cfg.identity
    if not (ident.pod_name and ident.namespace):
        return None
    try:
        from .. import podstatus
    except ImportError as exc:
        log.warning("pod conditions disabled: %s", exc)
        return None
    if not service_account_dir:
        return podstatus.PodStatusReporter(ident.namespace, ident.pod_name)
    api = podstatus.service_account_client(service_account_dir)
    problem = podstatus.access_problem(api, ident.namespace, ident.pod_name)
    if problem:
        raise BadInput(f"--service-account-dir {service_account_dir}: {problem}; bind the pod's "
                       f"ServiceAccount to the agent ClusterRole (get pods, patch pods/status) in "
                       f"{ident.namespace}")
    return podstatus.PodStatusReporter(ident.namespace, ident.pod_name, podstatus.api_patcher(api))


def cannot_listen(cfg: Any, reason: str) -> str:
    """A listener could not bind: the address and the ports that were asked for, and the fix."""
    listen, last = cfg.listen, cfg.tp_size - 1
    ports = ", ".join(
        f"{name} {port}" + (f"-{port + last}" if last and ranked else "")
        for name, port, ranked in (("bootstrap", listen.bootstrap_port, False),
                                   ("metrics", listen.metrics_port, False),
                                   ("control", listen.control_port, True), ("lane", listen.lane_port, True))
        if port
    )
    return (
        f"listen.host {listen.host} (--listen-host), ports {ports or 'any'}: cannot listen ({reason}); "
        "give an address of this host and ports no other process holds (0: any free port; "
        "rank r listens on control + r and lane + r)"
    )


def fault_wrapper(env: Mapping[str, str]) -> Any:
    """The ``FaultyTransport`` wrapper ``PDPAIR_TEST_FAULTS`` asks for, else None."""
    text = env.get(FAULTS_ENV)
    if not text:
        return None
    from ..transports.faulty import FaultPlan, FaultyTransport

    plan = FaultPlan.parse(text, FAULTS_ENV)
    log.warning("%s=%s: injecting transport faults (tests only)", FAULTS_ENV, text)
    return lambda transport: FaultyTransport(transport, plan)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_format, args.log_level)
    from ..agent.pod import start_in_process
    from ..agent.roles import tight_timers

    tight_timers()  # before any thread starts: the engine's progress threads inherit it

    cfg = load(args)
    ranks = served_ranks(cfg, args)
    wrap = fault_wrapper(os.environ)
    reporter = pod_reporter(cfg, args.service_account_dir)
    try:
        if cfg.localapi.engine.mode == "external":
            from ..localapi.ranks import serve

            return serve(cfg, ranks, reporter=reporter, ready_file=args.ready_file)
        pod = start_in_process(cfg, ranks, reporter=reporter, wrap_transport=wrap)
    except Exception as exc:
        code = getattr(exc, "errno", None)  # OSError, and zmq.ZMQError which is not one
        if code not in BIND_ERRNOS:
            raise
        raise BadInput(cannot_listen(cfg, os.strerror(code))) from None
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: pod.stop_event.set())
    if args.ready_file:
        pod.write_ready_file(args.ready_file)
    while not pod.stop_event.wait(0.5):
        if not pod.alive():
            log.error("a rank's worker thread died; exiting")
            break
    crashed = not pod.alive()
    started = time.monotonic()
    pod.stop()
    log.info("shutdown took %.2fs", time.monotonic() - started)
    return 1 if crashed else 0
