"""Test shim in front of ``pdpair-agent`` under the local pod runner: cluster DNS does not exist here,
so the decode's ``peer.bootstrapHost`` (the bootstrap Service's DNS name) is rewritten to the loopback
address the runner gave that generation's prefill pod, read from a JSON hosts file the test keeps.

``--host-memory``: this machine has no GPU (the kwok nodes' GPUs and DRA devices are inventory only),
so ``transfer.device: cuda`` becomes ``cpu``: the agent and a sidecar engine keep their state in host
memory, everything else as the operator rendered it.

Usage: python agent_shim.py HOSTS_FILE [--host-memory] -- AGENT_ARGV...
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import yaml


def lookup(hosts_file: Path, host: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            mapping = json.loads(hosts_file.read_text() or "{}")
        except (OSError, ValueError):
            mapping = {}
        if host in mapping:
            return str(mapping[host])
        time.sleep(0.2)
    raise SystemExit(f"agent_shim: no address for {host} in {hosts_file}")


def main() -> None:
    hosts_file, *options = sys.argv[1:sys.argv.index("--")]
    argv = sys.argv[sys.argv.index("--") + 1:]
    assert set(options) <= {"--host-memory"}, __doc__
    config = Path(argv[argv.index("--config") + 1])
    doc = yaml.safe_load(config.read_text())
    before = yaml.safe_dump(doc)
    peer = doc.setdefault("peer", {})
    host = peer.get("bootstrapHost", "")
    if argv[argv.index("--role") + 1] == "decode" and host.endswith(".svc"):
        peer["bootstrapHost"] = lookup(Path(hosts_file), host)
    if "--host-memory" in options and doc.get("transfer", {}).get("device") == "cuda":
        doc["transfer"]["device"] = "cpu"
    if yaml.safe_dump(doc) != before:
        local = config.with_name(f"agent.local.{os.getpid()}.yaml")  # the pod's containers share the volume
        local.write_text(yaml.safe_dump(doc))
        argv[argv.index("--config") + 1] = str(local)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
