"""Local pod runner: run the agent containers of Running (kwok) pods as local processes.

Role: for end-to-end tests. kwok marks pods Running without running anything;
:class:`PodRunner` lists the pods of a namespace/label selector, and for each
Running pod it has not seen yet it gives the pod its own loopback address
(127.0.B.x, B a random block per runner; kwok's pod IP is never used or connected to), resolves each mapped
container's environment, downward-API fields and mounted ConfigMaps/Secrets
(:mod:`devcluster.podspec`) and starts the container's command as a local process
in its own process group, logging to a per-pod directory. As the kubelet does, it asks the API
server for a token of the pod's ServiceAccount, bound to the pod, wherever a projected volume asks
for one, and gives every container ``KUBERNETES_SERVICE_HOST``/``PORT`` (the real API server's
loopback address, as pod IPs are replaced by loopback ones): a process authenticates as its pod's
ServiceAccount, never with the runner's own credentials. Pods that disappear
from the API (or start terminating) have their processes stopped; a test can
also stop or kill a pod's processes, or delete the pod.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from devcluster import podspec, procs

RETRY_SECONDS = 2.0
"""A pod that could not start is tried again after this long."""
BASE_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "VIRTUAL_ENV", "PYTHONPATH")


class Kubectl(Protocol):
    """What the runner needs from a cluster: :meth:`devcluster.Cluster.kubectl`."""

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]: ...


@dataclass
class LocalProcess:
    """One container of a pod, running (or finished) as a local process."""

    container: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes]

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class LocalPod:
    """A pod the runner has taken on."""

    namespace: str
    name: str
    uid: str
    address: str
    pod_ip: str
    directory: Path
    processes: dict[str, LocalProcess] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    stopped: bool = False
    tokens: list[str] = field(default_factory=list)
    """The identities of the ServiceAccount tokens written into the pod's volumes."""

    def alive(self) -> bool:
        return any(p.alive() for p in self.processes.values())

    def returncodes(self) -> dict[str, int | None]:
        return {name: p.proc.poll() for name, p in self.processes.items()}


def _addresses(first_block: int = 1) -> Iterator[str]:
    """127.0.B.1 .. 127.0.B.254 for B = first_block .. 254, then 1 .. first_block - 1."""
    for third in (*range(first_block, 255), *range(1, first_block)):
        for fourth in range(1, 255):
            yield f"127.0.{third}.{fourth}"


class PodRunner:
    """Runs the mapped containers of Running pods matching ``namespace``/``selector`` locally.

    ``commands`` maps a container's ``command[0]`` (or its basename), or, for a
    container without a command, its image (with or without tag) or name, to
    the local argv prefix that replaces it, e.g. ``{"pdpair-agent": [".venv/bin/pdpair-agent"]}``.
    Containers with no mapping are skipped (listed in ``LocalPod.skipped``),
    unless ``containers`` names them, which makes a missing mapping an error.
    """

    def __init__(
        self,
        cluster: Kubectl,
        namespace: str,
        commands: Mapping[str, Sequence[str]],
        *,
        selector: str = "",
        containers: Collection[str] | None = None,
        extra_env: Mapping[str, str] | None = None,
        workdir: Path | None = None,
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.selector = selector
        self.commands = {k: list(v) for k, v in commands.items()}
        self.containers = set(containers) if containers is not None else None
        self.extra_env = dict(extra_env or {})
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="pdpair-pods-"))
        self._volumes = Path(tempfile.mkdtemp(prefix="pdv-"))
        """The pods' emptyDirs, shared by their containers as in a pod, under a short path: a Unix socket
        in an emptyDir must fit in 108 bytes."""
        self.pods: dict[str, LocalPod] = {}  # by uid
        # A random first /24 block: runners of test sessions running side by side on one machine
        # rarely hand out the same address (agents bind fixed ports on it).
        self._free = _addresses(random.randint(1, 254))
        self._lock = threading.RLock()
        self._stop_watch = threading.Event()
        self._watcher: threading.Thread | None = None
        self._service_env: dict[str, str] | None = None
        self.errors: dict[str, str] = {}
        """Pods that could not start (by ``namespace/name``), tried again as the kubelet does."""
        self._retry_at: dict[str, float] = {}

    # ---- API access ---------------------------------------------------------------------
    def _list_pods(self) -> list[dict[str, Any]]:
        args = ["get", "pods", "-n", self.namespace, "-o", "json"]
        if self.selector:
            args += ["-l", self.selector]
        return list(json.loads(self.cluster.kubectl(*args, timeout=30).stdout)["items"])

    def _lookup(self, kind: str, namespace: str, name: str) -> dict[str, bytes] | None:
        proc = self.cluster.kubectl(
            "get", kind.lower(), name, "-n", namespace, "-o", "json", check=False, timeout=30
        )
        if proc.returncode != 0:
            if "NotFound" in proc.stderr or "not found" in proc.stderr:
                return None
            raise RuntimeError(f"kubectl get {kind} {namespace}/{name}: {proc.stderr.strip()}")
        return podspec.decode_object(json.loads(proc.stdout))

    def _token(self, pod: LocalPod, obj: Mapping[str, Any], source: Mapping[str, Any]) -> bytes:
        """A TokenRequest for the pod's ServiceAccount, bound to the pod (void once it is gone), with the
        source's lifetime and audience: what the kubelet writes into the pod's token volume."""
        meta = obj["metadata"]
        account = obj["spec"].get("serviceAccountName") or "default"
        args = ["create", "token", account, "-n", meta["namespace"], "--bound-object-kind=Pod",
                f"--bound-object-name={meta['name']}", f"--bound-object-uid={meta['uid']}",
                f"--duration={int(source.get('expirationSeconds') or 3600)}s"]
        if source.get("audience"):
            args.append(f"--audience={source['audience']}")
        proc = self.cluster.kubectl(*args, check=False, timeout=30)
        if proc.returncode != 0:
            raise podspec.PodSpecError(f"TokenRequest for ServiceAccount {meta['namespace']}/{account} "
                                       f"of pod {meta['name']}: {proc.stderr.strip()}")
        pod.tokens.append(f"system:serviceaccount:{meta['namespace']}:{account}")
        return proc.stdout.strip().encode()

    def service_env(self) -> dict[str, str]:
        """``KUBERNETES_SERVICE_HOST``/``PORT``: where in-cluster clients find the API server."""
        if self._service_env is None:
            server = self.cluster.kubectl(
                "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}").stdout
            parsed = urllib.parse.urlsplit(server.strip())
            self._service_env = {"KUBERNETES_SERVICE_HOST": parsed.hostname or "",
                                 "KUBERNETES_SERVICE_PORT": str(parsed.port or 443)}
        return dict(self._service_env)

    # ---- the loop -------------------------------------------------------------------------
    def sync(self) -> list[LocalPod]:
        """Start newly Running pods, stop pods gone from the API; return the pods now running."""
        with self._lock:
            listed = self._list_pods()
            runnable = {p["metadata"]["uid"]: p for p in listed if _runnable(p)}
            for uid, pod in self.pods.items():
                if uid not in runnable and pod.alive():
                    self._terminate(pod)
            for uid, obj in runnable.items():
                if uid not in self.pods:
                    self._try_start(uid, obj)
            return [p for p in self.pods.values() if p.uid in runnable and not p.stopped]

    def wait_for_pods(self, count: int, timeout: float = 60) -> list[LocalPod]:
        """Sync until at least ``count`` pods run locally; raise TimeoutError otherwise."""
        result: list[LocalPod] = []

        def enough() -> bool:
            nonlocal result
            result = self.sync()
            return len(result) >= count

        if not procs.wait_until(enough, timeout=timeout, interval=0.5):
            why = "".join(f"; {key}: {error}" for key, error in sorted(self.errors.items()))
            raise TimeoutError(f"{len(result)} of {count} pods running locally after {timeout:.0f}s{why}")
        return result

    def watch(self, interval: float = 0.5) -> None:
        """Keep syncing in a background thread until :meth:`close`."""
        if self._watcher is not None:
            return
        self._watcher = threading.Thread(
            target=self._watch_loop, args=(interval,), daemon=True, name="podrunner"
        )
        self._watcher.start()

    def _watch_loop(self, interval: float) -> None:
        while not self._stop_watch.wait(interval):
            try:
                self.sync()
            except (RuntimeError, subprocess.SubprocessError, ValueError) as exc:
                (self.workdir / "watch-errors.log").open("a").write(f"{exc}\n")

    # ---- starting a pod ---------------------------------------------------------------------
    def _try_start(self, uid: str, obj: Mapping[str, Any]) -> None:
        """Start the pod, or record why it cannot start (the next sync tries again)."""
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        if time.monotonic() < self._retry_at.get(key, 0.0):
            return
        try:
            self.pods[uid] = self._start_pod(obj)
        except podspec.PodSpecError as exc:
            if self.errors.get(key) != str(exc):
                with (self.workdir / "pod-errors.log").open("a") as log:
                    log.write(f"{key}: {exc}\n")
            self.errors[key] = str(exc)
            self._retry_at[key] = time.monotonic() + RETRY_SECONDS
        else:
            self.errors.pop(key, None)
            self._retry_at.pop(key, None)

    def _start_pod(self, obj: Mapping[str, Any]) -> LocalPod:
        meta = obj["metadata"]
        pod = LocalPod(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta["uid"],
            address=next(self._free),
            pod_ip=obj.get("status", {}).get("podIP", ""),
            directory=self.workdir / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}",
        )
        resolved = [self._resolve(pod, obj, container) for container in obj["spec"]["containers"]]
        for local in resolved:  # every container resolved (volumes, tokens) before any starts
            if local is not None:
                env = {**self._base_env(), **self.service_env(), "HOSTNAME": pod.name, **local.env}
                log = pod.directory / f"{local.name}.log"
                proc = procs.spawn(local.argv, log, env=env, cwd=local.cwd)
                pod.processes[local.name] = LocalProcess(local.name, local.argv, log, proc)
        return pod

    def _resolve(self, pod: LocalPod, obj: Mapping[str, Any],
                 container: Mapping[str, Any]) -> podspec.LocalContainer | None:
        name = str(container["name"])
        if self.containers is not None and name not in self.containers:
            pod.skipped.append(name)
            return None
        (pod.directory / name).mkdir(parents=True, exist_ok=True)
        local = podspec.resolve_container(
            obj,
            container,
            address=pod.address,
            lookup=self._lookup,
            commands=self.commands,
            volume_root=pod.directory / name / "volumes",
            shared_root=self._volumes / pod.uid[:12],
            token=lambda o, source: self._token(pod, o, source),
        )
        if local is None:
            if self.containers is not None:
                raise podspec.PodSpecError(f"no command mapping for container {name!r} of pod {pod.name}")
            pod.skipped.append(name)
        return local

    def _base_env(self) -> dict[str, str]:
        base = {k: os.environ[k] for k in BASE_ENV_KEYS if k in os.environ}
        return {**base, "PYTHONUNBUFFERED": "1", **self.extra_env}

    # ---- controlling pods ---------------------------------------------------------------------
    def pod(self, name: str) -> LocalPod:
        """The newest local pod with this name."""
        with self._lock:
            matches = [p for p in self.pods.values() if p.name == name]
        if not matches:
            raise KeyError(f"pod {name!r} is not run by this runner")
        return matches[-1]

    def address(self, name: str) -> str:
        """The loopback address standing in for the pod's IP."""
        return self.pod(name).address

    def ip_map(self) -> dict[str, str]:
        """kwok pod IP -> loopback address, for every pod taken on."""
        with self._lock:
            return {p.pod_ip: p.address for p in self.pods.values() if p.pod_ip}

    def logs(self, name: str, container: str | None = None) -> str:
        """The output of the pod's container (the first one run if not named)."""
        pod = self.pod(name)
        proc = pod.processes[container] if container else next(iter(pod.processes.values()))
        return proc.log.read_text(errors="replace") if proc.log.exists() else ""

    def stop(self, name: str, grace: float = 5.0) -> None:
        """SIGTERM the pod's processes (SIGKILL after ``grace``); the pod object stays."""
        pod = self.pod(name)
        with self._lock:
            pod.stopped = True
            self._terminate(pod, grace)

    def kill(self, name: str) -> None:
        """SIGKILL the pod's processes at once; the pod object stays."""
        pod = self.pod(name)
        with self._lock:
            pod.stopped = True
            for process in pod.processes.values():
                procs.kill_group(process.proc.pid, process.proc)

    def delete_pod(self, name: str, wait: bool = True, timeout: float = 60) -> None:
        """Stop the pod's processes and delete the pod object (kwok removes it)."""
        self.stop(name)
        args = ["delete", "pod", name, "-n", self.namespace, f"--wait={'true' if wait else 'false'}"]
        self.cluster.kubectl(*args, f"--timeout={int(timeout)}s", timeout=timeout + 10)

    def _terminate(self, pod: LocalPod, grace: float = 5.0) -> None:
        for process in pod.processes.values():
            procs.stop_group(process.proc.pid, grace=grace, proc=process.proc)

    def close(self) -> None:
        """Stop watching and every process; remove the work directory if we made it."""
        self._stop_watch.set()
        if self._watcher is not None:
            self._watcher.join(timeout=10)
        with self._lock:
            for pod in self.pods.values():
                self._terminate(pod)
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        shutil.rmtree(self._volumes, ignore_errors=True)

    def __enter__(self) -> PodRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _runnable(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")
