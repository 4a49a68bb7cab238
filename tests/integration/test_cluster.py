"""The local control plane against real Kubernetes semantics, and the local pod runner.

Shows: a CRD and a custom object applied with kubectl; server-side schema validation
rejecting a bad object; a pod owned by the object scheduled onto a kwok node and
Running with a pod IP; the garbage collector removing the pod once the owner is
deleted; and the pod runner running a pod's command as a local process on its own
loopback address with its downward-API env and mounted ConfigMap/Secret.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import sys
import textwrap
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from devcluster import Cluster, PodRunner
from devcluster.cluster import POD_CIDR
from devcluster.procs import wait_until

pytestmark = [pytest.mark.cluster]

GROUP = "devcluster-test.pdpair.dev"
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"widgets.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1, "maximum": 10},
                                    "mode": {"type": "string", "enum": ["prefill", "decode"]},
                                },
                            }
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    assert wait_until(lambda: _has_default_sa(cluster, name), timeout=30, interval=0.2), "no default SA"
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _has_default_sa(cluster: Cluster, namespace: str) -> bool:
    return cluster.kubectl("get", "sa", "default", "-n", namespace, check=False).returncode == 0


def _widget(name: str, size: Any, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"size": size, "mode": "prefill"},
    }


def _pod(name: str, namespace: str, owner: dict[str, Any] | None = None, **container: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {"app": "devcluster-test"}}
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    spec = {"name": "agent", "image": "registry.invalid/pdpair/agent:test", **container}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [spec]}}


def _wait_running(cluster: Cluster, namespace: str, name: str, timeout: float = 60) -> dict[str, Any]:
    cluster.kubectl(
        "wait",
        f"pod/{name}",
        "-n",
        namespace,
        "--for=jsonpath={.status.phase}=Running",
        f"--timeout={int(timeout)}s",
        timeout=timeout + 10,
    )
    pod: dict[str, Any] = cluster.kubectl_json("get", "pod", name, "-n", namespace)
    return pod


def _gone(cluster: Cluster, *args: str) -> bool:
    proc = cluster.kubectl("get", *args, check=False)
    return proc.returncode != 0 and "NotFound" in proc.stderr


def test_crd_validation_scheduling_and_garbage_collection(cluster: Cluster, namespace: str) -> None:
    cluster.apply([CRD])
    try:
        cluster.kubectl("wait", f"crd/widgets.{GROUP}", "--for=condition=Established", "--timeout=30s")
        _check_crd_and_gc(cluster, namespace)
    finally:
        cluster.kubectl("delete", "crd", f"widgets.{GROUP}", "--wait=false", check=False)


def _check_crd_and_gc(cluster: Cluster, namespace: str) -> None:
    cluster.apply([_widget("good", 3, namespace)])
    owner = cluster.kubectl_json("get", "widget", "good", "-n", namespace)
    assert owner["spec"] == {"size": 3, "mode": "prefill"}

    rejected = cluster.kubectl(
        "apply", "-f", "-", input=yaml.safe_dump(_widget("bad", 100, namespace)), check=False
    )
    assert rejected.returncode != 0
    assert "spec.size: Invalid value" in rejected.stderr, rejected.stderr
    assert "less than or equal to 10" in rejected.stderr, rejected.stderr
    assert _gone(cluster, "widget", "bad", "-n", namespace)

    cluster.apply([_pod("owned", namespace, owner, command=["sleep", "infinity"])])
    pod = _wait_running(cluster, namespace, "owned")
    _assert_kwok_ran(cluster, pod)

    cluster.kubectl("delete", "widget", "good", "-n", namespace)
    assert wait_until(lambda: _gone(cluster, "pod", "owned", "-n", namespace), timeout=60, interval=0.5), (
        "garbage collector did not remove the owned pod"
    )


def test_namespace_controller_empties_and_removes_namespace(cluster: Cluster) -> None:
    name = f"t-ns-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("create", "configmap", "leftover", "-n", name, "--from-literal=a=1")
    cluster.kubectl("delete", "namespace", name, "--wait=true", "--timeout=60s", timeout=70)
    assert _gone(cluster, "namespace", name)


def _assert_kwok_ran(cluster: Cluster, pod: dict[str, Any]) -> None:
    status = pod["status"]
    assert pod["spec"]["nodeName"], "pod was not scheduled"
    assert status["phase"] == "Running"
    assert status["containerStatuses"][0]["state"].get("running"), status
    assert status.get("podIP"), status
    if cluster.external_kubeconfig is None:
        assert pod["spec"]["nodeName"].startswith("kwok-node-")
        assert ipaddress.ip_address(status["podIP"]) in ipaddress.ip_network(POD_CIDR)


AGENT = textwrap.dedent(
    """
    import json, os, signal, socket, sys
    config = json.load(open(sys.argv[2]))
    info = {k: os.environ.get(k) for k in ("POD_NAME", "POD_NAMESPACE", "POD_IP", "NODE_NAME", "GREETING")}
    info["token"] = open(os.environ["TOKEN_FILE"]).read()
    info["config"] = config
    server = socket.create_server((os.environ["POD_IP"], 0))
    signal.signal(signal.SIGTERM, lambda *_: (print("TERM", flush=True), sys.exit(0)))
    print("LISTENING", *server.getsockname(), flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            conn.sendall(json.dumps(info).encode() + b"\\n")
    """
)


def _agent_objects(namespace: str, names: list[str]) -> list[dict[str, Any]]:
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "agent", "namespace": namespace},
        "data": {"agent.py": AGENT, "settings.json": json.dumps({"role": "prefill"}), "greeting": "hello"},
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "agent-token", "namespace": namespace},
        "stringData": {"token": "s3cret"},
    }
    return [config_map, secret, *(_agent_pod(name, namespace) for name in names)]


def _agent_pod(name: str, namespace: str) -> dict[str, Any]:
    def field(path: str) -> dict[str, Any]:
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}

    env = [
        {"name": "POD_NAME", **field("metadata.name")},
        {"name": "POD_NAMESPACE", **field("metadata.namespace")},
        {"name": "POD_IP", **field("status.podIP")},
        {"name": "NODE_NAME", **field("spec.nodeName")},
        {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "agent", "key": "greeting"}}},
        {"name": "TOKEN_FILE", "value": "/var/run/agent/token"},
    ]
    pod = _pod(
        name,
        namespace,
        command=["python3", "/opt/agent/agent.py", "--config", "/opt/agent/settings.json"],
        env=env,
        volumeMounts=[
            {"name": "code", "mountPath": "/opt/agent"},
            {"name": "token", "mountPath": "/var/run/agent", "readOnly": True},
        ],
    )
    pod["spec"]["volumes"] = [
        {"name": "code", "configMap": {"name": "agent"}},
        {"name": "token", "secret": {"secretName": "agent-token"}},
    ]
    return pod


def _listening(runner: PodRunner, name: str) -> tuple[str, int]:
    found: list[tuple[str, int]] = []

    def check() -> bool:
        match = re.search(r"LISTENING (\S+) (\d+)", runner.logs(name))
        if match:
            found.append((match.group(1), int(match.group(2))))
        return bool(found)

    assert wait_until(check, timeout=20, interval=0.1), f"agent did not listen:\n{runner.logs(name)}"
    return found[0]


def _ask(address: tuple[str, int]) -> dict[str, Any]:
    assert ipaddress.ip_address(address[0]).is_loopback
    with socket.create_connection(address, timeout=5) as conn:
        data: dict[str, Any] = json.loads(conn.makefile().readline())
        return data


def test_podrunner_runs_pods_locally(cluster: Cluster, namespace: str) -> None:
    cluster.apply(_agent_objects(namespace, ["agent-0", "agent-1", "agent-2"]))
    with PodRunner(
        cluster, namespace, {"python3": [sys.executable]}, selector="app=devcluster-test"
    ) as runner:
        pods = {p.name: p for p in runner.wait_for_pods(3, timeout=60)}
        assert len({p.address for p in pods.values()}) == 3
        _check_agent(cluster, runner, namespace, "agent-0")

        runner.stop("agent-0")
        assert not runner.pod("agent-0").alive()
        assert runner.pod("agent-0").returncodes() == {"agent": 0}
        assert "TERM" in runner.logs("agent-0")
        assert not _gone(cluster, "pod", "agent-0", "-n", namespace), "stop() must leave the pod object"
        assert {p.name for p in runner.sync()} == {"agent-1", "agent-2"}, "a stopped pod is not restarted"

        runner.delete_pod("agent-1")
        assert _gone(cluster, "pod", "agent-1", "-n", namespace)
        assert not runner.pod("agent-1").alive()

        cluster.kubectl("delete", "pod", "agent-2", "-n", namespace, "--wait=true", "--timeout=60s")
        assert runner.sync() == []
        assert not runner.pod("agent-2").alive(), "a pod deleted in the API has its process stopped"


def _check_agent(cluster: Cluster, runner: PodRunner, namespace: str, name: str) -> None:
    address = _listening(runner, name)
    assert address[0] == runner.address(name)
    info = _ask(address)
    kwok_ip = cluster.kubectl_json("get", "pod", name, "-n", namespace)["status"]["podIP"]
    assert info["POD_IP"] == runner.address(name) != kwok_ip
    assert runner.ip_map()[kwok_ip] == runner.address(name)
    assert info["POD_NAME"] == name and info["POD_NAMESPACE"] == namespace
    assert info["NODE_NAME"]
    assert info["GREETING"] == "hello"
    assert info["token"] == "s3cret"
    assert info["config"] == {"role": "prefill"}


WHOAMI = textwrap.dedent(
    """
    import base64, json, os, ssl, sys, urllib.request
    directory = sys.argv[1]
    token = open(f"{directory}/token").read()
    context = ssl.create_default_context(cafile=f"{directory}/ca.crt")
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    body = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode()
    request = urllib.request.Request(
        f"https://{host}:{port}/apis/authentication.k8s.io/v1/selfsubjectreviews", data=body, method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    with opener.open(request, timeout=10) as resp:
        user = json.loads(resp.read())["status"]["userInfo"]
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    print("WHOAMI", json.dumps({"user": user["username"], "claims": claims,
                                "namespace": open(f"{directory}/namespace").read()}), flush=True)
    """
)


def test_podrunner_authenticates_pods_as_their_own_service_account(cluster: Cluster, namespace: str) -> None:
    """A projected token volume gets a TokenRequest token of the pod's ServiceAccount, bound to the pod,
    and the container reaches the API server through KUBERNETES_SERVICE_HOST/PORT as that account."""
    directory = "/var/run/secrets/tokens"
    cluster.apply([{"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": "reporter", "namespace": namespace},
                    "automountServiceAccountToken": False},
                   {"apiVersion": "v1", "kind": "ConfigMap", "data": {"whoami.py": WHOAMI},
                    "metadata": {"name": "whoami", "namespace": namespace}}])
    pod = _pod("whoami", namespace, command=["python3", "/opt/whoami/whoami.py", directory],
               volumeMounts=[{"name": "code", "mountPath": "/opt/whoami"},
                             {"name": "api", "mountPath": directory, "readOnly": True}])
    pod["spec"].update(serviceAccountName="reporter", automountServiceAccountToken=False, volumes=[
        {"name": "code", "configMap": {"name": "whoami"}},
        {"name": "api", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                                        "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}])
    cluster.apply([pod])
    commands = {"python3": [sys.executable]}
    with PodRunner(cluster, namespace, commands, selector="app=devcluster-test") as runner:
        runner.wait_for_pods(1, timeout=60)
        assert wait_until(lambda: "WHOAMI" in runner.logs("whoami"), timeout=30, interval=0.2), \
            runner.logs("whoami")
        seen = json.loads(runner.logs("whoami").split("WHOAMI", 1)[1])
        uid = cluster.kubectl_json("get", "pod", "whoami", "-n", namespace)["metadata"]["uid"]
        assert seen["user"] == f"system:serviceaccount:{namespace}:reporter", seen
        assert seen["claims"]["kubernetes.io"]["pod"] == {"name": "whoami", "uid": uid}, seen["claims"]
        assert seen["namespace"] == namespace
        assert runner.pod("whoami").tokens == [f"system:serviceaccount:{namespace}:reporter"]


def test_podrunner_starts_no_pod_whose_service_account_is_missing(cluster: Cluster, namespace: str) -> None:
    """No token, no start (the kubelet cannot mount the volume either): the reason is kept, by pod."""
    pod = _pod("orphan", namespace, command=["python3", "-c", "print('STARTED')"],
               volumeMounts=[{"name": "api", "mountPath": "/var/run/secrets/tokens"}])
    pod["spec"].update(serviceAccountName="gone", volumes=[{"name": "api", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}}])
    cluster.kubectl("create", "serviceaccount", "gone", "-n", namespace)
    cluster.apply([pod])
    cluster.kubectl("delete", "serviceaccount", "gone", "-n", namespace)
    commands = {"python3": [sys.executable]}
    with PodRunner(cluster, namespace, commands, selector="app=devcluster-test") as runner:
        why = rf"TokenRequest for ServiceAccount {namespace}/gone of pod orphan"
        with pytest.raises(TimeoutError, match=why):
            runner.wait_for_pods(1, timeout=10)
        assert runner.pods == {}
