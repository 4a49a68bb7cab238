"""Operator scale benchmark: N PDPairs → every child created and every pod Running (kwok), next to the
floor — a bare ``kubectl apply`` of the very same pods, Services and ConfigMaps — in the same run.

    .venv/bin/python bench/operator_scale.py --sizes 50 200 500 [--json] [--kubeconfig PATH]

Without --kubeconfig a devcluster is started (enough kwok nodes for the pods) and stopped afterwards.
Each size runs the floor first, then a fresh operator (scoped to the size's namespace, so its memory
is that size's) against ``kubectl apply`` of N PDPairs; both clocks start before ``kubectl apply`` and
stop when the API server lists every object and every pod Running. Operator memory: peak RSS (VmHWM).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator"), str(REPO / "tests" / "e2e")]

from pdpair_operator import render  # noqa: E402
from pdpair_operator.observe import Owner  # noqa: E402
from pdpair_operator.spec import generation_hash, parse_spec  # noqa: E402

from devcluster import Cluster  # noqa: E402
from devcluster.cluster import ensure_binaries  # noqa: E402

PODS_PER_PAIR = 2
OBJECTS_PER_PAIR = PODS_PER_PAIR + 4


def pair_spec() -> dict[str, Any]:
    return {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "profile": "pure-kv", "pageSize": 16},
        "image": "ghcr.io/pdpair/agent:0.1.0",
        "transfer": {"backend": "nixl", "device": "cpu"},
        "prefill": {"replicas": 1, "resources": {"gpus": 0}},
        "decode": {"replicas": 1, "resources": {"gpus": 0}},
    }


def manifest_stream(docs: list[dict[str, Any]]) -> str:
    """A YAML stream of JSON documents: PyYAML leaves strings such as a generation hash ``442495e3``
    unquoted, which kubectl's YAML parser then reads as a number."""
    return "\n---\n".join(json.dumps(d) for d in docs)


def pdpairs_yaml(n: int) -> str:
    docs = [{"apiVersion": "pdpair.io/v1alpha1", "kind": "PDPair", "metadata": {"name": f"b{i}"},
             "spec": pair_spec()} for i in range(n)]
    return manifest_stream(docs)


def floor_yaml(n: int, namespace: str) -> str:
    """What the operator would create for the same PDPairs, without owner references."""
    docs = []
    for i in range(n):
        owner = Owner(f"b{i}", namespace, "none", 1, parse_spec(pair_spec()))
        gen = generation_hash(owner.spec)
        for m in (render.build_config_map(owner, gen), render.build_bootstrap_service(owner, gen),
                  render.build_headless_service(owner), render.build_metrics_service(owner),
                  render.build_pod(owner, gen, "prefill", 0), render.build_pod(owner, gen, "decode", 0)):
            del m["metadata"]["ownerReferences"]
            docs.append(m)
    return manifest_stream(docs)


def counts(cluster: Cluster, namespace: str) -> tuple[int, int, int]:
    """(objects, pods, running pods) the API server lists in ``namespace``."""
    template = "jsonpath={range .items[*]}{.kind} {.status.phase}{'\\n'}{end}"
    out = cluster.kubectl("get", "pods,services,configmaps", "-n", namespace, "-l", "pdpair.io/name",
                          "-o", template, timeout=120).stdout
    lines = [ln.split() for ln in out.splitlines() if ln.strip()]
    pods = [ln for ln in lines if ln[0] == "Pod"]
    running = sum(1 for ln in pods if len(ln) > 1 and ln[1] == "Running")
    return len(lines), len(pods), running


def wait_complete(cluster: Cluster, namespace: str, n: int, started: float, timeout: float) -> float:
    want = n * OBJECTS_PER_PAIR
    while time.monotonic() - started < timeout:
        objects, _pods, running = counts(cluster, namespace)
        if objects >= want and running >= n * PODS_PER_PAIR:
            return time.monotonic() - started
        time.sleep(0.5)
    raise TimeoutError(f"{namespace}: not complete after {timeout:.0f}s ({counts(cluster, namespace)})")


def run_floor(cluster: Cluster, n: int, timeout: float) -> float:
    ns = f"pdpair-bench-floor-{n}-{uuid.uuid4().hex[:4]}"
    cluster.kubectl("create", "namespace", ns)
    text = floor_yaml(n, ns)
    started = time.monotonic()
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=text, timeout=timeout)
    elapsed = wait_complete(cluster, ns, n, started, timeout)
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
    return elapsed


def peak_rss_mb(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmHWM"].split()[0]) / 1024, int(fields["VmRSS"].split()[0]) / 1024


def run_operator(cluster: Cluster, n: int, timeout: float, logdir: Path) -> dict[str, float]:
    ns = f"pdpair-bench-op-{n}-{uuid.uuid4().hex[:4]}"
    cluster.kubectl("create", "namespace", ns)
    argv = [str(REPO / ".venv" / "bin" / "pdpair-operator"), "--standalone", "--namespace", ns,
            "--metrics-port", "0", "--quiet"]
    with (logdir / f"operator-{n}.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=cluster.env())
    try:
        time.sleep(3.0)
        text = pdpairs_yaml(n)
        started = time.monotonic()
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=text, timeout=timeout)
        elapsed = wait_complete(cluster, ns, n, started, timeout)
        peak, now = peak_rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
    return {"seconds": elapsed, "peak_rss_mb": peak, "rss_mb": now}


def wait_namespaces_gone(cluster: Cluster, timeout: float = 600) -> None:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        out = cluster.kubectl("get", "namespaces", "-o", "name").stdout
        if "pdpair-bench-" not in out:
            return
        time.sleep(2)


def header() -> dict[str, Any]:
    import kopf
    import kubernetes

    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.node(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "kopf": kopf.__version__
            if hasattr(kopf, "__version__") else "1.45.2", "kubernetes_client": kubernetes.__version__,
            "command": " ".join(sys.argv)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[50, 200, 500])
    ap.add_argument("--kubeconfig", type=Path, help="use this cluster instead of starting a devcluster")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = ap.parse_args()
    logdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"pdpair-bench-{uuid.uuid4().hex[:6]}"
    logdir.mkdir(parents=True)
    nodes = max(3, math.ceil(max(args.sizes) * PODS_PER_PAIR / 100) + 1)
    cluster = Cluster.existing(args.kubeconfig) if args.kubeconfig else Cluster(
        workdir=logdir / "k8s", binaries=ensure_binaries(), nodes=nodes)
    cluster.start(timeout=300)
    results = []
    try:
        from operator_support import install_crd

        install_crd(cluster)
        for n in args.sizes:
            floor = run_floor(cluster, n, args.timeout)
            wait_namespaces_gone(cluster)
            op = run_operator(cluster, n, args.timeout, logdir)
            wait_namespaces_gone(cluster)
            row = {"n": n, "objects": n * OBJECTS_PER_PAIR, "floor_seconds": round(floor, 2),
                   "operator_seconds": round(op["seconds"], 2), "ratio": round(op["seconds"] / floor, 2),
                   "operator_peak_rss_mb": round(op["peak_rss_mb"], 1)}
            results.append(row)
            if not args.json:
                print(f"N={n:4d} objects={row['objects']:5d} floor={row['floor_seconds']:7.2f}s "
                      f"operator={row['operator_seconds']:7.2f}s ratio={row['ratio']:.2f}x "
                      f"peak_rss={row['operator_peak_rss_mb']:.0f}MB", flush=True)
    finally:
        if not args.kubeconfig:
            cluster.stop()
    report = {"header": header(), "results": results, "logs": str(logdir)}
    print(json.dumps(report, indent=2) if args.json else f"logs: {logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
