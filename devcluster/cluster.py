"""The local Kubernetes control plane: etcd, kube-apiserver, controller-manager, scheduler, kwok.

Role: :class:`Cluster` starts every component on 127.0.0.1 with free ports and
throw-away certificates in a data directory, creates a few kwok-managed
(simulated) nodes and their simulated DRA GPU inventory (``dra.py``: DeviceClasses
and ResourceSlices, so the scheduler allocates ResourceClaims on kwok nodes),
waits until pods can be scheduled, writes an admin
kubeconfig, and stops everything again (process groups: SIGTERM, then SIGKILL).
Pod IPs (kwok) and service IPs are drawn from CIDRs nothing ever connects to.

Binaries come from ``hack/build-k8s.sh``, in
``${XDG_CACHE_HOME:-$HOME/.cache}/pdpair/k8s/<kubernetes-version>/bin``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from devcluster import dra, pki, procs

REPO_ROOT = Path(__file__).resolve().parents[1]
VERSIONS_FILE = REPO_ROOT / "hack" / "versions.env"
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-k8s.sh"
KWOK_STAGES = Path(__file__).with_name("kwok_stages.yaml")

POD_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
NODE_ANNOTATION = "kwok.x-k8s.io/node"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
BINARIES = (*COMPONENTS, "kubectl", "helm")


AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "verbs": ["patch"],
               "resources": [{"group": "", "resources": ["pods/status"]}]},
              {"level": "None"}],
}
"""The audit log records pod-status patches only (who reported a pod's conditions), at Metadata level."""


class ClusterError(RuntimeError):
    """A component failed to start, or the cluster did not become ready in time."""


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """Parse ``KEY=value`` lines of hack/versions.env."""
    versions: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            versions[key.strip()] = value.strip()
    return versions


def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-$HOME/.cache}/pdpair``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pdpair"


def bin_dir(kubernetes_version: str | None = None) -> Path:
    """Where hack/build-k8s.sh puts the binaries for ``kubernetes_version`` (default: pinned)."""
    version = kubernetes_version or read_versions()["KUBERNETES_VERSION"]
    return cache_root() / "k8s" / version / "bin"


def missing_binaries(directory: Path | None = None) -> list[str]:
    """Names of the binaries not (yet) in ``directory``."""
    directory = directory or bin_dir()
    return [name for name in BINARIES if not os.access(directory / name, os.X_OK)]


def ensure_binaries(log: Callable[[str], None] = print) -> Path:
    """Build whatever is missing (hack/build-k8s.sh) and return the bin directory."""
    directory = bin_dir()
    if missing_binaries(directory):
        log(f"building missing Kubernetes binaries into {directory} (hack/build-k8s.sh) ...")
        proc = subprocess.run([str(BUILD_SCRIPT)], check=False)
        if proc.returncode != 0:
            raise ClusterError(f"hack/build-k8s.sh failed with exit status {proc.returncode}")
    still_missing = missing_binaries(directory)
    if still_missing:
        raise ClusterError(f"binaries missing after build: {', '.join(still_missing)}")
    return directory


def kubectl_path(directory: Path | None = None) -> str:
    """The pinned kubectl if built, else the one on PATH."""
    candidate = (directory or bin_dir()) / "kubectl"
    if os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("kubectl")
    if not found:
        raise ClusterError("no kubectl: run hack/build-k8s.sh")
    return found


def _no_proxy_opener(context: ssl.SSLContext) -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )


def _http_ok(opener: urllib.request.OpenerDirector, url: str) -> bool:
    try:
        with opener.open(url, timeout=2) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


NVIDIA_NODE_RESOURCES = {
    "cpu": "64", "memory": "512Gi", "ephemeral-storage": "1Ti", "pods": "110", "nvidia.com/gpu": "8",
}
AMD_NODE_RESOURCES = {
    "cpu": "64", "memory": "512Gi", "ephemeral-storage": "1Ti", "pods": "110", "amd.com/gpu": "8",
    "rdma/hca_shared_devices_a": "8",
}
AMD_NODE_LABELS = {"node.kubernetes.io/instance-type": "mi300x"}
AMD_NODE_TAINT = {"key": "amd.com/gpu", "value": "present", "effect": "NoSchedule"}
"""AMD nodes look like an MI300X node with the RDMA shared device plugin: a ROCm workload (the MoRI
example) schedules there; the taint keeps everything that does not tolerate it on the NVIDIA nodes."""


def _node_manifest(name: str, amd: bool = False) -> dict[str, Any]:
    resources = AMD_NODE_RESOURCES if amd else NVIDIA_NODE_RESOURCES
    labels = {
        "type": "kwok",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **(AMD_NODE_LABELS if amd else {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": labels,
        },
        "spec": {"taints": [AMD_NODE_TAINT]} if amd else {},
        "status": {"allocatable": resources, "capacity": resources},
    }


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


RESTART_ATTEMPTS = 20


@dataclass
class Ports:
    """Loopback ports of one cluster."""

    etcd_client: int = field(default_factory=procs.free_port)
    etcd_peer: int = field(default_factory=procs.free_port)
    apiserver: int = field(default_factory=procs.free_port)
    controller_manager: int = field(default_factory=procs.free_port)
    scheduler: int = field(default_factory=procs.free_port)


class Cluster:
    """A local control plane in ``workdir`` (a fresh temporary directory by default)."""

    def __init__(
        self,
        workdir: Path | None = None,
        binaries: Path | None = None,
        nodes: int = 3,
        detached: bool = False,
        amd_nodes: int = 4,
    ) -> None:
        """``nodes`` NVIDIA and ``amd_nodes`` AMD kwok nodes; ``detached``: components outlive this
        process (``python -m devcluster up``)."""
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="pdpair-k8s-"))
        self.binaries = binaries or bin_dir()
        self.nodes = nodes
        self.amd_nodes = amd_nodes
        self.ports = Ports()
        self.pids: dict[str, int] = {}
        self._popen: dict[str, subprocess.Popen[bytes]] = {}
        self.external_kubeconfig: Path | None = None
        self.start_seconds: float | None = None
        self.detached = detached

    # ---- construction from an existing cluster / saved state ----------------------------
    @classmethod
    def existing(cls, kubeconfig: Path) -> Cluster:
        """A handle on a cluster someone else runs: kubectl works, start/stop do nothing."""
        cluster = cls(workdir=Path(kubeconfig).parent)
        cluster._owns_workdir = False
        cluster.external_kubeconfig = Path(kubeconfig)
        return cluster

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Cluster:
        """Re-attach to a cluster started by another process (see :meth:`state`)."""
        cluster = cls(
            workdir=Path(state["workdir"]),
            binaries=Path(state["binaries"]),
            nodes=state["nodes"],
            amd_nodes=state.get("amd_nodes", 0),
        )
        cluster._owns_workdir = True
        cluster.ports = Ports(**state["ports"])
        cluster.pids = {name: int(pid) for name, pid in state["pids"].items()}
        return cluster

    def state(self) -> dict[str, Any]:
        """What :meth:`from_state` needs, JSON-serialisable."""
        return {
            "workdir": str(self.workdir),
            "binaries": str(self.binaries),
            "nodes": self.nodes,
            "amd_nodes": self.amd_nodes,
            "ports": vars(self.ports),
            "pids": dict(self.pids),
            "kubeconfig": str(self.kubeconfig),
            "server": self.server,
        }

    # ---- paths ----------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (system:masters)."""
        return self.external_kubeconfig or self.workdir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://{procs.LOOPBACK}:{self.ports.apiserver}"

    @property
    def pki(self) -> pki.Pki:
        return pki.Pki(self.workdir / "pki")

    @property
    def audit_log(self) -> Path:
        """The API server's audit log (JSON lines): who patched which pod's status (``AUDIT_POLICY``).
        Absent for a cluster someone else runs."""
        return self.workdir / "logs" / "audit.log"

    def log_path(self, component: str) -> Path:
        return self.workdir / "logs" / f"{component}.log"

    def env(self) -> dict[str, str]:
        """``os.environ`` plus KUBECONFIG for this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    # ---- kubectl --------------------------------------------------------------------------
    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; raise ClusterError on failure if ``check``."""
        argv = [kubectl_path(self.binaries), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def kubectl_json(self, *args: str, timeout: float = 60) -> Any:
        """``kubectl ... -o json``, parsed."""
        return json.loads(self.kubectl(*args, "-o", "json", timeout=timeout).stdout)

    def apply(
        self, manifests: str | Sequence[dict[str, Any]], *extra: str
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl apply -f -`` with YAML text or a list of objects.

        Objects go as a stream of JSON documents: PyYAML leaves strings such as ``442495e3`` unquoted,
        which kubectl's YAML parser reads as numbers."""
        text = manifests if isinstance(manifests, str) else "\n---\n".join(json.dumps(m) for m in manifests)
        return self.kubectl("apply", "-f", "-", *extra, input=text)

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self, timeout: float = 180) -> None:
        """Start all components, create the nodes and wait until pods can run."""
        if self.external_kubeconfig:
            self.wait_ready(timeout)
            return
        begin = time.monotonic()
        try:
            self._start_components(timeout)
            nodes = [_node_manifest(f"kwok-node-{i}") for i in range(self.nodes)]
            nodes += [_node_manifest(f"kwok-amd-node-{i}", amd=True) for i in range(self.amd_nodes)]
            self.apply(nodes)
            self.publish_dra_inventory(nodes)
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - begin

    def publish_dra_inventory(self, nodes: list[dict[str, Any]]) -> None:
        """DeviceClasses and one ResourceSlice per kwok GPU node and vendor (``devcluster/dra.py``:
        simulated, like the nodes' GPU capacity), each slice owned by its Node."""
        uids = {n["metadata"]["name"]: n["metadata"]["uid"]
                for n in self.kubectl_json("get", "nodes")["items"]}
        named = [{**n, "metadata": {**n["metadata"], "uid": uids[n["metadata"]["name"]]}} for n in nodes]
        self.apply(dra.inventory(named, dra.GPU_RESOURCES))

    def restart(self, name: str, timeout: float = 120) -> float:
        """Kill one component with SIGKILL and start it again with the same arguments (a crash and
        its supervisor's restart); returns the seconds until the API server is ready again.

        Between the two, another process's outgoing connection can be given the component's port as
        its ephemeral port; the new component then exits at once ("address already in use") and is
        started again, as a supervisor would, until ``timeout``."""
        args = {"kube-apiserver": self._apiserver_args, "kube-scheduler": self._scheduler_args,
                "kube-controller-manager": self._controller_manager_args, "kwok": self._kwok_args}[name]
        begin = time.monotonic()
        deadline = begin + timeout
        pid = self.pids.pop(name, None)
        if pid is not None and self._is_ours(name, pid):
            procs.kill_group(pid, proc=self._popen.pop(name, None))
        for _ in range(RESTART_ATTEMPTS):
            self._launch(name, args())
            exited = procs.wait_until(partial(_exited, self._popen[name]), timeout=3.0, interval=0.1)
            if not exited or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        self.wait_ready(max(1.0, deadline - time.monotonic()))
        return time.monotonic() - begin

    def add_node(self, name: str) -> None:
        """A kwok node (again: AMD when named like the AMD ones), with its simulated DRA inventory."""
        node = _node_manifest(name, amd=name.startswith("kwok-amd-node-"))
        self.apply([node])
        self.publish_dra_inventory([node])

    def _start_components(self, timeout: float) -> None:
        missing = missing_binaries(self.binaries)
        if missing:
            raise ClusterError(f"missing binaries in {self.binaries}: {missing}; run hack/build-k8s.sh")
        for sub in ("logs", "etcd", "kwok"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        pki.generate(self.pki.root, self.server)  # also writes admin.kubeconfig (self.kubeconfig)
        self._launch("etcd", self._etcd_args())
        self._wait_http("etcd", f"http://{procs.LOOPBACK}:{self.ports.etcd_client}/health", timeout)
        self._launch("kube-apiserver", self._apiserver_args())
        self._wait_http("kube-apiserver", f"{self.server}/readyz", timeout)
        self._launch("kube-controller-manager", self._controller_manager_args())
        self._launch("kube-scheduler", self._scheduler_args())
        self._launch("kwok", self._kwok_args())

    def stop(self, remove_data: bool | None = None) -> None:
        """Stop every component (reverse order) and remove the data directory if we made it."""
        for name in reversed(COMPONENTS):
            pid = self.pids.pop(name, None)
            if pid is not None and self._is_ours(name, pid):
                procs.stop_group(pid, grace=10.0, proc=self._popen.get(name))
            self._popen.pop(name, None)
        if remove_data if remove_data is not None else self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _is_ours(self, name: str, pid: int) -> bool:
        argv = procs.pid_cmdline(pid)
        return bool(argv) and Path(argv[0]).name == name

    def running(self) -> bool:
        """All components alive and the API server ready."""
        alive = all(name in self.pids and self._is_ours(name, self.pids[name]) for name in COMPONENTS)
        return alive and self._apiserver_ready()

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- readiness ------------------------------------------------------------------------
    def wait_ready(self, timeout: float = 120) -> None:
        """Wait for /readyz, Ready kwok nodes and the default service account."""
        checks: list[tuple[str, Callable[[], bool]]] = [
            ("API server /readyz", self._ready_via_kubectl),
            ("kwok nodes Ready", self._nodes_ready),
            ("default service account (controller-manager)", self._default_sa_exists),
        ]
        deadline = time.monotonic() + timeout
        for what, check in checks:
            self._check_components_alive()
            if not procs.wait_until(check, timeout=max(1.0, deadline - time.monotonic()), interval=0.25):
                raise ClusterError(
                    f"timed out after {timeout:.0f}s waiting for {what}\n{self._diagnostics()}"
                )

    def _ready_via_kubectl(self) -> bool:
        return self.kubectl("get", "--raw=/readyz", check=False, timeout=10).returncode == 0

    def _nodes_ready(self) -> bool:
        proc = self.kubectl("get", "nodes", "-o", "json", check=False, timeout=10)
        if proc.returncode != 0:
            return False
        items = json.loads(proc.stdout)["items"]
        ready = [n for n in items if _condition_true(n, "Ready") and not _tainted(n)]
        wanted = self.nodes + self.amd_nodes if not self.external_kubeconfig else 1
        return len(ready) >= wanted

    def _default_sa_exists(self) -> bool:
        return (
            self.kubectl(
                "get", "serviceaccount", "default", "-n", "default", check=False, timeout=10
            ).returncode
            == 0
        )

    def _apiserver_ready(self) -> bool:
        return _http_ok(self._opener(), f"{self.server}/readyz")

    def _check_components_alive(self) -> None:
        for name, proc in self._popen.items():
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited with {proc.returncode}:\n{_tail(self.log_path(name))}")

    def _diagnostics(self) -> str:
        return "\n".join(f"--- {name} log tail ---\n{_tail(self.log_path(name), 10)}" for name in self._popen)

    def _opener(self) -> urllib.request.OpenerDirector:
        context = ssl.create_default_context(cafile=str(self.pki.ca_crt))
        context.load_cert_chain(str(self.pki.client_crt("admin")), str(self.pki.client_key("admin")))
        return _no_proxy_opener(context)

    def _wait_http(self, name: str, url: str, timeout: float) -> None:
        opener = self._opener() if url.startswith("https") else _no_proxy_opener(ssl.create_default_context())

        def ok() -> bool:
            self._check_components_alive()
            return _http_ok(opener, url)

        if not procs.wait_until(ok, timeout=timeout, interval=0.2):
            raise ClusterError(
                f"{name} not healthy at {url} after {timeout:.0f}s:\n{_tail(self.log_path(name))}"
            )

    def _launch(self, name: str, args: list[str]) -> None:
        argv = [str(self.binaries / name), *args]
        # SIGKILL, not SIGTERM: kube-apiserver hangs in graceful shutdown once etcd is gone
        on_death = None if self.detached else signal.SIGKILL
        proc = procs.spawn(argv, self.log_path(name), cwd=self.workdir, on_parent_death=on_death)
        self._popen[name] = proc
        self.pids[name] = proc.pid

    # ---- command lines ----------------------------------------------------------------------
    def _etcd_args(self) -> list[str]:
        client = f"http://{procs.LOOPBACK}:{self.ports.etcd_client}"
        peer = f"http://{procs.LOOPBACK}:{self.ports.etcd_peer}"
        return [
            "--name=devcluster",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=devcluster={peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
            "--quota-backend-bytes=2147483648",
            "--snapshot-count=10000",
        ]

    def _apiserver_args(self) -> list[str]:
        p = self.pki
        return [
            f"--etcd-servers=http://{procs.LOOPBACK}:{self.ports.etcd_client}",
            f"--bind-address={procs.LOOPBACK}",
            f"--advertise-address={procs.LOOPBACK}",
            f"--secure-port={self.ports.apiserver}",
            f"--cert-dir={p.root}",
            f"--tls-cert-file={p.server_crt}",
            f"--tls-private-key-file={p.server_key}",
            f"--client-ca-file={p.ca_crt}",
            "--authorization-mode=RBAC",
            "--anonymous-auth=false",
            f"--service-account-key-file={p.sa_pub}",
            f"--service-account-signing-key-file={p.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
            f"--audit-policy-file={self._audit_policy()}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-maxsize=64",
            "--audit-log-maxbackup=1",
            "--v=1",
        ]

    def _audit_policy(self) -> Path:
        path = self.workdir / "audit-policy.yaml"
        path.write_text(yaml.safe_dump(AUDIT_POLICY))
        return path

    def _component_serving(self, name: str, port: int) -> list[str]:
        kubeconfig = self.pki.kubeconfig(name)
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--bind-address={procs.LOOPBACK}",
            f"--secure-port={port}",
            f"--cert-dir={self.workdir / name}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        ]

    def _controller_manager_args(self) -> list[str]:
        p = self.pki
        return [
            *self._component_serving("controller-manager", self.ports.controller_manager),
            "--controllers=*",
            "--use-service-account-credentials=true",
            "--allocate-node-cidrs=false",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--root-ca-file={p.ca_crt}",
            f"--service-account-private-key-file={p.sa_key}",
            f"--cluster-signing-cert-file={p.ca_crt}",
            f"--cluster-signing-key-file={p.ca_key}",
        ]

    def _scheduler_args(self) -> list[str]:
        return self._component_serving("scheduler", self.ports.scheduler)

    def _kwok_args(self) -> list[str]:
        config = self.workdir / "kwok" / "kwok.yaml"
        options = {
            "cidr": POD_CIDR,
            "nodeIP": procs.LOOPBACK,
            "manageNodesWithAnnotationSelector": f"{NODE_ANNOTATION}=fake",
            # kwok only defaults these when it has no --config; set them explicitly
            "podPlayStageParallelism": 4,
            "nodePlayStageParallelism": 4,
            "nodeLeaseParallelism": 4,
            "nodeLeaseDurationSeconds": 40,
            "podsOnNodeSyncParallelism": 1,
            "enablePodsOnNodeSyncListPager": True,
            "enablePodsOnNodeSyncStreamWatch": True,
        }
        head = {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokConfiguration",
            "options": options,
        }
        config.write_text(yaml.safe_dump(head) + "---\n" + KWOK_STAGES.read_text())
        return [f"--kubeconfig={self.pki.kubeconfig('kwok')}", f"--config={config}"]


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is not None


def _condition_true(obj: dict[str, Any], kind: str) -> bool:
    conditions = obj.get("status", {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def _tainted(node: dict[str, Any]) -> bool:
    """True while the node lifecycle controller's not-ready/unreachable taints are on the node."""
    keys = {t.get("key") for t in node.get("spec", {}).get("taints") or []}
    return bool(keys & {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
