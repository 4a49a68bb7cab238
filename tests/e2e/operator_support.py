"""Helpers for the operator's end-to-end tests: the CRD and the agents' ClusterRole, the operator as a
subprocess, polling, the test's cluster DNS for real agents, and a test that plays the agents (patching
each pod's ``pdpair.io/TransferReady`` as an agent would)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dataplane.harness.waiting import wait_for
from devcluster import Cluster
from devcluster.procs import free_port
from tests.chart_support import CHART, helm

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "pdpair.yaml"
EXAMPLES = REPO / "examples"
TRANSFER_READY = "pdpair.io/TransferReady"



def install_crd(cluster: Cluster) -> None:
    """Apply the CRD and poll for Established (``kubectl wait`` fails outright while a freshly created
    CRD has no conditions yet)."""
    cluster.kubectl("apply", "-f", str(CRD))

    def established() -> bool:
        crd = cluster.kubectl_json("get", "crd", "pdpairs.pdpair.io")
        return condition(crd, "Established").get("status") == "True"

    wait_for("CRD pdpairs.pdpair.io Established", established, timeout=60)


E2E_AGENT_ROLE = "pdpair-e2e-agent"


def install_agent_role(cluster: Cluster) -> str:
    """The agents' ClusterRole for the operator to bind, rendered from the chart (release ``pdpair-e2e``),
    and its name. ``PDPAIR_OPERATOR_AGENT_ROLE`` names one a chart release installed instead
    (tests/e2e/test_chart_install.py, whose operator may bind only its own release's)."""
    named = os.environ.get("PDPAIR_OPERATOR_AGENT_ROLE")
    if named:
        return named
    rendered = helm("template", "pdpair-e2e", str(CHART), "--show-only", "templates/agent-rbac.yaml").stdout
    cluster.kubectl("apply", "-f", "-", input=rendered)
    return E2E_AGENT_ROLE


@contextmanager
def running_operator(cluster: Cluster, log: Path, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """``pdpair-operator`` as a subprocess on the cluster's kubeconfig (stopped on exit).

    ``PDPAIR_OPERATOR_KUBECONFIG`` gives the operator alone another identity: tests/e2e/test_chart_install.py
    runs this suite with a token of the Helm chart's ServiceAccount, so only the chart's RBAC applies."""
    argv = [str(REPO / ".venv" / "bin" / "pdpair-operator"), "--standalone", "--log-format", "full",
            "--metrics-port", str(free_port()), f"--agent-cluster-role={install_agent_role(cluster)}", *extra]
    env = {**cluster.env(), "PYTHONUNBUFFERED": "1"}
    if os.environ.get("PDPAIR_OPERATOR_KUBECONFIG"):
        env["KUBECONFIG"] = os.environ["PDPAIR_OPERATOR_KUBECONFIG"]
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def get(cluster: Cluster, kind: str, ns: str, *args: str) -> Any:
    return cluster.kubectl_json("get", kind, "-n", ns, *args)


def pods(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    return list(get(cluster, "pods", ns, "-l", f"pdpair.io/name={name}")["items"])


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def pdpair(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    return dict(get(cluster, "pdpair", ns, name))


def report(cluster: Cluster, ns: str, pod: str, status: str, reason: str, message: str) -> None:
    """What ``dataplane.podstatus.PodStatusReporter`` sends, sent by the test."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {"status": {"conditions": [{"type": TRANSFER_READY, "status": status, "reason": reason,
                                       "message": message, "lastTransitionTime": now}]}}
    cluster.kubectl("patch", "pod", pod, "-n", ns, "--subresource=status", "--type=strategic",
                    "-p", json.dumps(body), check=False)


class FakeAgents:
    """Background thread: every Running pod of the PDPair reports TransferReady=True, like an agent that
    completed its handshake. ``hold`` names pods that must stay silent."""

    def __init__(self, cluster: Cluster, ns: str, name: str) -> None:
        self.cluster, self.ns, self.name = cluster, ns, name
        self.hold: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> FakeAgents:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(0.3):
            try:
                for pod in pods(self.cluster, self.ns, self.name):
                    meta = pod["metadata"]
                    if (meta["name"] in self.hold or meta.get("deletionTimestamp")
                            or pod.get("status", {}).get("phase") != "Running"):
                        continue
                    if condition(pod, TRANSFER_READY).get("reason") != "HandshakeComplete":
                        report(self.cluster, self.ns, meta["name"], "True", "HandshakeComplete", "test agent")
            except Exception as exc:  # the API server may be busy; the next round retries
                print(f"fake agents: {exc}", file=sys.stderr)


def publish_bootstrap_addresses(cluster: Cluster, runner: Any, ns: str, hosts: Path) -> None:
    """The test's cluster DNS: each bootstrap Service's name → the loopback address the runner gave the
    Running pod its selector picks, resolved from the API by pod UID (never a cluster IP)."""
    local = {p.uid: p.address for p in list(runner.pods.values()) if not p.stopped}
    mapping: dict[str, str] = {}
    for svc in get(cluster, "services", ns, "-l", "pdpair.io/child=bootstrap")["items"]:
        selector = ",".join(f"{k}={v}" for k, v in sorted(svc["spec"]["selector"].items()))
        for pod in get(cluster, "pods", ns, "-l", selector)["items"]:
            uid = pod["metadata"]["uid"]
            if uid in local and not pod["metadata"].get("deletionTimestamp"):
                mapping[f"{svc['metadata']['name']}.{ns}.svc"] = local[uid]
    tmp = hosts.with_suffix(".tmp")
    tmp.write_text(json.dumps(mapping))
    tmp.replace(hosts)


def operator_metrics(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def pdpair_yaml(name: str, p: int, d: int, image: str = "ghcr.io/pdpair/agent:0.1.0", **extra: Any) -> str:
    import yaml

    spec: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "profile": "pure-kv", "pageSize": 16,
                  "poolPages": 64, "maxRequests": 8},
        "image": image,
        "transfer": {"backend": "nixl", "device": "cpu"},
        "prefill": {"replicas": p, "resources": {"gpus": 0}},
        "decode": {"replicas": d, "resources": {"gpus": 0}},
    }
    spec.update(extra)
    return yaml.safe_dump({"apiVersion": "pdpair.io/v1alpha1", "kind": "PDPair",
                           "metadata": {"name": name}, "spec": spec})


def env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


class OperatorProcess:
    """``pdpair-operator`` for one namespace that a test may kill (SIGKILL) and start again; its writes
    are read from its own metrics (``pdpair_operator_api_requests_total``)."""

    def __init__(self, cluster: Cluster, log: Path, namespace: str) -> None:
        self.cluster, self.log, self.namespace = cluster, log, namespace
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.kills = 0

    def start(self) -> None:
        self.port = free_port()
        argv = [str(REPO / ".venv" / "bin" / "pdpair-operator"), "--standalone", "--log-format", "full",
                "--metrics-port", str(self.port), "--metrics-address", "127.0.0.1",
                "--namespace", self.namespace]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                         env={**self.cluster.env(), "PYTHONUNBUFFERED": "1"},
                                         start_new_session=True)
        wait_for("operator metrics", self._metrics_up, timeout=60, interval=0.2)

    def _metrics_up(self) -> bool:
        try:
            operator_metrics(self.port)
        except OSError:
            return False
        return True

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)
        self.kills += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def writes(self) -> float:
        """API writes the running process issued (creates, patches, deletes)."""
        return sum(float(line.rsplit(" ", 1)[1]) for line in operator_metrics(self.port).splitlines()
                   if line.startswith("pdpair_operator_api_requests_total{"))
