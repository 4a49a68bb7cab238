"""The README's cluster quickstart, run as written on the local control plane, once per file in examples/.

The block after the README line that names this file is the quickstart: ``helm install`` (the chart),
``kubectl apply -f examples/<x>.yaml``, ``kubectl get pdpair``. The test runs its commands with the
pinned helm and kubectl as a cluster admin, ``<registry>`` filled in and the example's file name in place
of the README's. It then plays the nodes, as every e2e test here does (kwok runs no containers):

- the operator Deployment's container runs as a local process with the Deployment's arguments (pod IP
  127.0.0.1, free ports), authenticated only by a TokenRequest token of the chart's operator
  ServiceAccount (kopf reads an in-cluster token from a fixed path no local process can be given, so
  the token comes in a kubeconfig that holds nothing else);
- the agents run through ``devcluster.PodRunner``, which writes each pod's own bound token where the
  pod's projected volume says and hands out no other credentials; ``agent_shim.py`` stands in for
  cluster DNS and, as no GPU exists here, keeps ``transfer.device: cuda`` state in host memory.

It reads ``READY True`` from the README's own ``kubectl get pdpair``, and proves every agent reported as
its PDPair's ServiceAccount: the account the API server named to the agent, the API server's audit log
of pod-status patches, the one token the runner wrote per pod, no kubeconfig in any agent's environment.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_support import EXAMPLES, REPO, publish_bootstrap_addresses

from dataplane.harness.waiting import wait_for
from devcluster import Cluster, PodRunner
from devcluster.cluster import bin_dir
from devcluster.procs import free_port
from tests.chart_support import helm, sa_kubeconfig

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

README = REPO / "README.md"
MARKER = "`tests/e2e/test_quickstart.py` runs this block"
README_EXAMPLE = "examples/qwen3-next-nixl.yaml"
REGISTRY = "registry.invalid/pdpair"
NAMESPACE = "pdpair-system"
RELEASE = "pdpair"
KWOK_USER = "kwok-controller"
CONTROL_PLANE = {KWOK_USER, "system:kube-scheduler",
                 "system:serviceaccount:kube-system:resource-claim-controller"}
"""Who else writes a pod's status: kwok as its kubelet, the scheduler (PodScheduled), and with DRA the
claim controller (resourceClaimStatuses)."""
"""kwok's client identity (devcluster/pki.py): it patches the pods' own status as a kubelet would."""
NOT_READY_HERE = {
    "deepseek-v32-mori.yaml": (
        "MoRI-IO (amd-mori, mori.io) is not importable",
        "MoRI-IO needs AMD GPUs, RDMA NICs and the amd-mori SDK, none of which exist here. The one "
        "stand-in the project allows, the MoRI hardware test double (dataplane/transports/mori_double.py), "
        "moves bytes only between engines of one process, and a PDPair's prefill and decode agents are "
        "separate pods, so separate processes: no simulation here can pair them. The quickstart runs as "
        "written up to the agents, which authenticate as their own ServiceAccount and then exit naming "
        "the missing SDK; the PDPair stays READY False."),
}
"""Examples that cannot turn Ready on this machine: the agents' error line, and why."""
NO_ENGINE_HERE = {
    "qwen3-next-sglang.yaml": (
        "sglang serves the model here: it needs NVIDIA GPUs and the model's weights, which this machine "
        "lacks, and kwok runs no container, so the engine containers never start. The quickstart runs "
        "as written up to the agents, which authenticate as their own ServiceAccount and wait for their "
        "engine's ranks on the local API; the PDPair stays READY False. The sglang flow itself is "
        "tests/integration/test_sglang_backend.py; the router tests/e2e/test_serving_on_cluster.py."),
}
"""Examples whose serving engine cannot run here: their agents run and wait for it."""


def examples() -> list[str]:
    return sorted(p.name for p in EXAMPLES.glob("*.yaml"))


def quickstart() -> list[list[str]]:
    """The README's quickstart commands (continuations joined, trailing comments dropped)."""
    text = README.read_text()
    block = text[text.index(MARKER):].split("```sh\n", 1)[1].split("```", 1)[0]
    joined = re.sub(r"\\\n\s*", " ", block)
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def commands_for(example: str) -> list[list[str]]:
    """The quickstart with ``<registry>`` filled in and ``example`` applied."""
    def fill(word: str) -> str:
        return word.replace("<registry>", REGISTRY).replace(README_EXAMPLE, f"examples/{example}")

    return [[fill(word) for word in argv] for argv in quickstart()]


def run(cluster: Cluster, argv: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    """One quickstart command, with the pinned binary of its name, in the repository, as cluster admin."""
    assert argv[0] in ("helm", "kubectl"), argv
    env = {"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin:/bin", "HOME": str(home),
           "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data")}
    proc = subprocess.run([str(bin_dir() / argv[0]), *argv[1:]], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=180, check=False)
    assert proc.returncode == 0, f"{shlex.join(argv)} failed:\n{proc.stdout}{proc.stderr}"
    return proc


def table(output: str) -> list[dict[str, str]]:
    """``kubectl get``'s table, rows as {column: value}, columns cut where the header's start."""
    header, *rows = output.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    return [{n: row[a:b].strip() for n, a, b in zip(names, starts, [*starts[1:], None], strict=True)}
            for row in rows]


@pytest.fixture(scope="module")
def fresh_cluster(cluster: Cluster) -> Iterator[None]:
    """The cluster as the quickstart expects it: no release ``pdpair`` and no foreign owner of the CRD.
    Earlier tests of the session may have left the (kept) CRD owned by another release or by no release;
    helm adopts only a CRD annotated for this release, as an admin would annotate it."""
    crd = cluster.kubectl("get", "crd", "pdpairs.pdpair.io", "-o", "json", check=False)
    if crd.returncode == 0:
        crd_name = "crd/pdpairs.pdpair.io"
        cluster.kubectl("label", crd_name, "--overwrite", "app.kubernetes.io/managed-by=Helm")
        cluster.kubectl("annotate", crd_name, "--overwrite", f"meta.helm.sh/release-name={RELEASE}",
                        f"meta.helm.sh/release-namespace={NAMESPACE}")
    yield
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


class ChartOperator:
    """The chart's operator Deployment, its container run as a local process (see the module docstring)."""

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        deploy = cluster.kubectl_json("get", "deployment", f"{RELEASE}-operator", "-n", NAMESPACE)
        pod = deploy["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        local = {ports["metrics"]: free_port(), ports["health"]: free_port()}
        args = [a.replace("$(POD_IP)", "127.0.0.1") for a in container["args"]]
        for port, free in local.items():
            args = [re.sub(rf"(=|:){port}\b", rf"\g<1>{free}", a) for a in args]
        kubeconfig = sa_kubeconfig(cluster, NAMESPACE, pod["serviceAccountName"],
                                   workdir / "operator.kubeconfig")
        self.log = workdir / "operator.log"
        self.argv = [str(REPO / ".venv" / "bin" / "pdpair-operator"), *args]
        env = {"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin", "HOME": str(workdir),
               **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)

    def alive(self) -> bool:
        if self.proc.poll() is None:
            return True
        raise AssertionError(f"the operator exited: {self.log.read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def ready_row(cluster: Cluster, get: list[str], home: Path, name: str) -> dict[str, str] | None:
    rows = [r for r in table(run(cluster, get, home).stdout) if r.get("NAME") == name]
    return rows[0] if rows else None


def agent_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def audit_users(cluster: Cluster, pods: list[str]) -> dict[str, set[str]]:
    """Per pod, who patched its status successfully (the API server's audit log)."""
    users: dict[str, set[str]] = {p: set() for p in pods}
    for line in cluster.audit_log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        ok = event.get("responseStatus", {}).get("code") == 200
        if ok and ref.get("namespace") == NAMESPACE and ref.get("name") in users \
                and ref.get("subresource") == "status":
            users[ref["name"]].add(event["user"]["username"])
    return users


@pytest.mark.parametrize("example", examples())
def test_readme_quickstart(cluster: Cluster, fresh_cluster: None, example: str, tmp_path: Path) -> None:
    name = yaml.safe_load((EXAMPLES / example).read_text())["metadata"]["name"]
    install, apply_example, get = commands_for(example)
    assert install[:2] == ["helm", "install"] and apply_example[:2] == ["kubectl", "apply"], quickstart()
    assert get[:3] == ["kubectl", "get", "pdpair"], quickstart()
    run(cluster, install, tmp_path)
    operator = ChartOperator(cluster, tmp_path)
    hosts = tmp_path / "hosts.json"
    hosts.write_text("{}")
    shim = [sys.executable, str(Path(__file__).with_name("agent_shim.py")), str(hosts), "--host-memory", "--",
            str(REPO / ".venv" / "bin" / "pdpair-agent")]
    stop = threading.Event()
    runner = PodRunner(cluster, NAMESPACE, {"pdpair-agent": shim}, selector=f"pdpair.io/name={name}",
                       workdir=tmp_path / "pods")
    try:
        run(cluster, apply_example, tmp_path)
        runner.watch(interval=0.3)
        threading.Thread(target=_publish, args=(cluster, runner, hosts, stop), daemon=True).start()
        _check(cluster, runner, operator, get, tmp_path, name, example)
    finally:
        stop.set()
        cluster.kubectl("delete", "-n", NAMESPACE, "-f", str(EXAMPLES / example), "--wait=true",
                        "--timeout=60s", check=False, timeout=90)
        runner.close()
        operator.stop()
        helm("uninstall", RELEASE, f"--namespace={NAMESPACE}", "--wait", "--timeout=60s", check=False,
             env={"KUBECONFIG": str(cluster.kubeconfig), "HELM_CACHE_HOME": str(tmp_path / "cache"),
                  "HELM_CONFIG_HOME": str(tmp_path / "config"), "HELM_DATA_HOME": str(tmp_path / "data")})


def _publish(cluster: Cluster, runner: PodRunner, hosts: Path, stop: threading.Event) -> None:
    while not stop.wait(0.3):
        try:
            publish_bootstrap_addresses(cluster, runner, NAMESPACE, hosts)
        except Exception as exc:  # a busy API server or a pod mid-start: the next round retries
            print(f"publishing bootstrap addresses: {exc}", file=sys.stderr)


def _check(cluster: Cluster, runner: PodRunner, operator: ChartOperator, get: list[str], home: Path,
           name: str, example: str) -> None:
    spec = yaml.safe_load((EXAMPLES / example).read_text())["spec"]
    replicas = spec["prefill"].get("replicas", 1) + spec["decode"].get("replicas", 1)
    account = f"system:serviceaccount:{NAMESPACE}:{name}-agent"

    def diagnostics() -> str:
        logs = "\n".join(f"--- {p.name}/{c}:\n{runner.logs(p.name, c)[-1500:]}"
                         for p in list(runner.pods.values()) for c in p.processes)
        listed = cluster.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", f"pdpair.io/name={name}")["items"]
        reports = {p["metadata"]["name"]: [c for c in p["status"].get("conditions", [])
                                           if c["type"].startswith("pdpair.io/")] for p in listed}
        return (f"operator log:\n{operator.log.read_text(errors='replace')[-3000:]}\n{logs}\n"
                f"runner: {runner.errors}\npod conditions: {reports}")

    failure = NOT_READY_HERE.get(example)
    if example in NO_ENGINE_HERE:
        wait_for(f"every agent of {name} authenticated, waiting for its engine", lambda: len(
            runner.pods) >= replicas and all(f"API identity: {account}" in runner.logs(p.name, "agent")
                                             for p in list(runner.pods.values())), timeout=120)
        assert all("engine" not in p.processes for p in runner.pods.values())
        assert (ready_row(cluster, get, home, name) or {}).get("READY") == "False", diagnostics()
    elif failure is None:
        try:
            wait_for(f"{name} READY True in `{shlex.join(get)}`",
                     lambda: operator.alive() and (r := ready_row(cluster, get, home, name))
                     and r["READY"] == "True" and r,
                     timeout=120, interval=1.0)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnostics()}") from None
    else:
        why, _explanation = failure
        wait_for(f"every agent of {name} exits with {why!r}", lambda: len(runner.pods) >= replicas and all(
            why in runner.logs(p.name, "agent") for p in list(runner.pods.values())), timeout=120)
        assert (ready_row(cluster, get, home, name) or {}).get("READY") == "False", diagnostics()
    listed = cluster.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", f"pdpair.io/name={name}")["items"]
    pods = [p for p in listed if not p["metadata"].get("deletionTimestamp")]
    assert len(pods) == replicas, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        _check_identity(runner, pod, name, account)
    if cluster.external_kubeconfig is None:  # the audit log exists for the cluster the tests started
        users = audit_users(cluster, [p["metadata"]["name"] for p in pods])
        # every report came from the agents' own account; an agent that exits before its first report
        # (NOT_READY_HERE) sent none
        if example in NO_ENGINE_HERE:  # an agent waiting for its engine may report not ready, or not yet
            assert all(u - CONTROL_PLANE <= {account} for u in users.values()), users
        else:
            expected = {account} if failure is None else set()
            assert all(u - CONTROL_PLANE == expected for u in users.values()), users


def _check_identity(runner: PodRunner, pod: dict[str, Any], name: str, account: str) -> None:
    spec, pod_name = pod["spec"], pod["metadata"]["name"]
    assert spec["serviceAccountName"] == f"{name}-agent" and spec["automountServiceAccountToken"] is False
    mounts = {c["name"]: {m["name"] for m in c.get("volumeMounts", [])} for c in spec["containers"]}
    assert {c for c, m in mounts.items() if "api-token" in m} == {"agent"}, mounts
    local = runner.pod(pod_name)
    assert local.tokens == [account], local.tokens
    assert f"API identity: {account}" in runner.logs(pod_name, "agent"), runner.logs(pod_name, "agent")
    for process in local.processes.values():
        if process.alive():
            assert "KUBECONFIG" not in agent_environ(process.proc.pid)
