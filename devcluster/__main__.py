"""Developer command: ``python -m devcluster up|down|status`` (used by ``make cluster-up``).

Role: keep one long-lived local cluster for poking at the operator with kubectl.
``up`` builds missing binaries, starts a cluster (or reuses the running one whose
state file exists and whose API server answers) and prints ``KUBECONFIG=<path>``
as its last line; ``down`` stops it and removes its data; ``status`` reports.
State lives in ``${XDG_CACHE_HOME:-$HOME/.cache}/pdpair/devcluster/``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from devcluster.cluster import Cluster, ClusterError, cache_root, ensure_binaries


def state_dir() -> Path:
    return cache_root() / "devcluster"


def state_file() -> Path:
    return state_dir() / "state.json"


def data_dir() -> Path:
    return state_dir() / "data"


def load() -> Cluster | None:
    """The cluster described by the state file, if there is one."""
    try:
        return Cluster.from_state(json.loads(state_file().read_text()))
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError):
        return None


def up(nodes: int, timeout: float) -> int:
    existing = load()
    if existing is not None and existing.running():
        print(f"reusing running cluster at {existing.server} (data in {existing.workdir})")
        print(f"KUBECONFIG={existing.kubeconfig}")
        return 0
    if existing is not None:
        print("previous cluster is not healthy; stopping what is left of it")
        existing.stop(remove_data=True)
    state_file().unlink(missing_ok=True)
    shutil.rmtree(data_dir(), ignore_errors=True)
    binaries = ensure_binaries()
    cluster = Cluster(workdir=data_dir(), binaries=binaries, nodes=nodes, detached=True)
    print(f"starting cluster in {cluster.workdir} ...", flush=True)
    cluster.start(timeout=timeout)
    state_file().write_text(json.dumps(cluster.state(), indent=2))
    print(
        f"cluster up at {cluster.server} in {cluster.start_seconds:.1f}s; logs in {cluster.workdir / 'logs'}"
    )
    print(f"KUBECONFIG={cluster.kubeconfig}")
    return 0


def down() -> int:
    cluster = load()
    if cluster is not None:
        cluster.stop(remove_data=True)
    state_file().unlink(missing_ok=True)
    shutil.rmtree(data_dir(), ignore_errors=True)
    print("cluster stopped" if cluster is not None else "no cluster state; nothing to stop")
    return 0


def status() -> int:
    cluster = load()
    if cluster is None:
        print("no cluster")
        return 1
    healthy = cluster.running()
    print(f"{'running' if healthy else 'NOT healthy'}: {cluster.server} pids={cluster.pids}")
    print(f"KUBECONFIG={cluster.kubeconfig}")
    return 0 if healthy else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--nodes", type=int, default=3, help="kwok nodes to create (up)")
    parser.add_argument("--timeout", type=float, default=180, help="seconds to wait for readiness (up)")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            return up(args.nodes, args.timeout)
        return down() if args.command == "down" else status()
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
