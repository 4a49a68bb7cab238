"""``build_*`` for a PDPair that serves: the sglang engine's command and probes, and the PD router in
front of the pair (Deployment, Service, and the ServiceAccount, Role and RoleBinding its pod discovery
needs). Pure, like ``render``: no client, no clock.

The router is sglang's own (``sglang_router.launch_router`` in PD mode). It finds the engines itself by
watching the API server for pods with the current generation's prefill and decode labels, and reads each
prefill pod's bootstrap port from the ``sglang.ai/bootstrap-port`` annotation: pods that come, go or
turn unready change its worker list without the operator touching the router. The selector names the
generation, because a request routed to a prefill and a decode of two generations could not move its
state (their agents never pair); a rollout therefore rolls the router too, and the Deployment keeps the
old router serving until the new one is ready.
"""

from __future__ import annotations

from typing import Any

from . import naming
from .observe import Owner
from .spec import PDPairSpec, Role, Sglang

BOOTSTRAP_PORT_ANNOTATION = "sglang.ai/bootstrap-port"
"""Where sglang-router's pod discovery reads a prefill pod's bootstrap port (its fixed default: the
router has no flag for it)."""
TRANSFER_BACKEND = "pdpair"
"""sglang's ``--disaggregation-transfer-backend`` value PDPair's plugin registers."""
ROUTER_UID = 65532
ROUTER_EPHEMERAL_REQUEST = "256Mi"
ROUTER_EPHEMERAL_LIMIT = "1Gi"
"""The router writes only logs and ``/tmp``; limits equal requests elsewhere (a Guaranteed pod)."""
SHM_DIR = "/dev/shm"


def sglang_args(spec: PDPairSpec, sglang: Sglang, role: Role) -> list[str]:
    """``sglang.launch_server``'s arguments for one role: the model, the role's TP (and, with
    ``dataParallelSize``, DP attention) sizes, the disaggregation mode with PDPair's backend, and on
    prefill the bootstrap port the router hands to decode (the agent serves it: the plugin's bootstrap
    server does not bind it)."""
    rs = spec.role(role)
    args = ["--model-path", sglang.model_path, "--host", "0.0.0.0", "--port", str(sglang.port),
            "--tp-size", str(rs.tensor_parallel_size),
            *(["--dp-size", str(rs.data_parallel_size), "--enable-dp-attention"]
              if rs.data_parallel_size > 1 else []),
            "--disaggregation-mode", role, "--disaggregation-transfer-backend", TRANSFER_BACKEND]
    if role == "prefill":
        args += ["--disaggregation-bootstrap-port", str(spec.ports.bootstrap)]
    return args + list(sglang.args)


def sglang_container(spec: PDPairSpec, sglang: Sglang, role: Role) -> dict[str, Any]:
    """The parts of the engine container an sglang engine adds: its command, port and probes.
    Readiness is sglang's ``/health`` (the scheduler answers); liveness only that the server listens (a
    busy scheduler is not a dead one: restarting it would drop every request in flight); the startup
    probe gives weight loading ``startupSeconds`` before either counts."""
    probe = {"httpGet": {"path": "/health", "port": "http"}, "timeoutSeconds": 5}
    alive = {"tcpSocket": {"port": "http"}, "timeoutSeconds": 5}
    return {
        "command": ["python3", "-m", "sglang.launch_server"],
        "env": [{"name": k, "value": v} for k, v in CACHE_ENV.items()],
        "args": sglang_args(spec, sglang, role),
        "ports": [{"name": "http", "containerPort": sglang.port, "protocol": "TCP"}],
        "startupProbe": {**probe, "periodSeconds": 10,
                         "failureThreshold": max(1, -(-sglang.startup_seconds // 10))},
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**alive, "periodSeconds": 15, "failureThreshold": 4},
    }


CACHE_DIR = "/var/cache/sglang"
ENGINE_VOLUMES = {"dshm": SHM_DIR, "engine-cache": CACHE_DIR, "engine-tmp": "/tmp"}
"""What an sglang engine writes, so its root filesystem can be read-only: ``/dev/shm`` (its processes
share tensors there; a container's default is 64 MiB), its caches (Hugging Face downloads, Triton's
and torch's compiled kernels) and ``/tmp``."""
CACHE_ENV = {"HOME": CACHE_DIR, "XDG_CACHE_HOME": CACHE_DIR, "HF_HOME": f"{CACHE_DIR}/huggingface",
             "TRITON_CACHE_DIR": f"{CACHE_DIR}/triton"}


def engine_volumes() -> list[dict[str, Any]]:
    """The emptyDirs of ``ENGINE_VOLUMES`` (``/dev/shm`` in memory). Weights downloaded by name land in
    ``engine-cache`` on the node's disk: mount a volume holding them for large models instead."""
    return [{"name": name, "emptyDir": {"medium": "Memory"} if path == SHM_DIR else {}}
            for name, path in ENGINE_VOLUMES.items()]


def engine_mounts() -> list[dict[str, Any]]:
    return [{"name": name, "mountPath": path} for name, path in ENGINE_VOLUMES.items()]


def pod_annotations(spec: PDPairSpec, role: Role) -> dict[str, str]:
    """What the router's discovery reads from an engine pod."""
    if spec.engine.sglang is None or role != "prefill":
        return {}
    return {BOOTSTRAP_PORT_ANNOTATION: str(spec.ports.bootstrap)}


def router_labels(owner: str) -> dict[str, str]:
    """The router pods' labels: not the children's (``managed-by``), so the operator's pod index never
    takes a router pod for an engine pod."""
    return {"app.kubernetes.io/name": "pdpair-router", "app.kubernetes.io/instance": owner,
            naming.LABEL_ROUTER: owner}


def _selector(owner: str, generation: str, role: Role) -> list[str]:
    labels = naming.pod_selector(owner, role, generation)
    return [f"{k}={v}" for k, v in sorted(labels.items())]


def router_args(owner: Owner, generation: str) -> list[str]:
    """``sglang_router.launch_router``'s arguments: PD mode over the generation's pods, found by
    Kubernetes discovery in the PDPair's namespace."""
    spec = owner.spec
    assert spec.engine.sglang is not None
    return [
        "--pd-disaggregation", "--host", "0.0.0.0", "--port", str(spec.router.port),
        "--policy", spec.router.policy,
        "--service-discovery", "--service-discovery-namespace", owner.namespace,
        "--service-discovery-port", str(spec.engine.sglang.port),
        "--prefill-selector", *_selector(owner.name, generation, "prefill"),
        "--decode-selector", *_selector(owner.name, generation, "decode"),
        "--worker-startup-timeout-secs", str(spec.engine.sglang.startup_seconds),
        *spec.router.args,
    ]


def _meta(owner: Owner, name: str, child: str) -> dict[str, Any]:
    return {"name": name, "labels": {**naming.owner_labels(owner.name), naming.LABEL_KIND: child}}


def build_router_service_account(owner: Owner) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": _meta(owner, naming.router(owner.name), "router")}


def build_router_role(owner: Owner) -> dict[str, Any]:
    """Pod discovery and nothing else: read the namespace's pods."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": _meta(owner, naming.router(owner.name), "router"),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]}


def build_router_role_binding(owner: Owner) -> dict[str, Any]:
    name = naming.router(owner.name)
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": _meta(owner, name, "router"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}]}


def build_router_deployment(owner: Owner, generation: str) -> dict[str, Any]:
    spec = owner.spec
    router = spec.router
    image = router.image or spec.engine.image
    labels = router_labels(owner.name)

    def probe(path: str, failures: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": 5, "timeoutSeconds": 2,
                "failureThreshold": failures}

    container = {
        "name": "router",
        "image": image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["python3", "-m", "sglang_router.launch_router"],
        "args": router_args(owner, generation),
        "ports": [{"name": "http", "containerPort": router.port, "protocol": "TCP"}],
        "readinessProbe": probe("/readiness", 3),
        "livenessProbe": probe("/liveness", 6),
        "resources": {"requests": {"cpu": router.cpu, "memory": router.memory,
                                   "ephemeral-storage": ROUTER_EPHEMERAL_REQUEST},
                      "limits": {"cpu": router.cpu, "memory": router.memory,
                                 "ephemeral-storage": ROUTER_EPHEMERAL_LIMIT}},
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": ROUTER_UID, "runAsGroup": ROUTER_UID,
            "allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(owner, naming.router(owner.name), "router"),
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": labels},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": {**labels, naming.LABEL_GENERATION: generation}},
                "spec": {
                    "serviceAccountName": naming.router(owner.name),
                    "enableServiceLinks": False,
                    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                    # Replicas on different nodes where the scheduler can: one node's loss keeps a
                    # router serving.
                    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100, "podAffinityTerm": {
                            "labelSelector": {"matchLabels": labels},
                            "topologyKey": "kubernetes.io/hostname"}}]}},
                },
            },
        },
    }


def build_router_disruption_budget(owner: Owner) -> dict[str, Any]:
    """A node drain takes at most one router at a time (with one replica it may take it: a budget that
    blocked every drain would be worse than the pause)."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": _meta(owner, naming.router(owner.name), "router"),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": router_labels(owner.name)}}}


def build_router_service(owner: Owner) -> dict[str, Any]:
    """The pair's front door: requests to it reach a router, which picks a prefill and a decode."""
    port = owner.spec.router.port
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(owner, naming.router(owner.name), "router"),
            "spec": {"selector": router_labels(owner.name),
                     "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]}}


def router_endpoint(owner: Owner) -> str:
    """What ``status.router`` names: the Service's DNS name and port."""
    return f"http://{naming.service_dns(naming.router(owner.name), owner.namespace)}:{owner.spec.router.port}"


def network_policy_rules(owner: Owner) -> list[dict[str, Any]]:
    """Ingress for a serving PDPair: the router reaches the engines' HTTP port; anyone the cluster lets
    through reaches the router (it is the front door; restrict it with your own policy)."""
    spec = owner.spec
    if not spec.serves:
        return []
    assert spec.engine.sglang is not None
    router_pods = {"podSelector": {"matchLabels": router_labels(owner.name)}}
    return [{"from": [router_pods], "ports": [{"protocol": "TCP", "port": spec.engine.sglang.port}]}]


def build_router_network_policy(owner: Owner) -> dict[str, Any]:
    port = owner.spec.router.port
    labels = router_labels(owner.name)
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(owner, naming.router_network_policy(owner.name), "router"),
            "spec": {"podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress"],
                     "ingress": [{"ports": [{"protocol": "TCP", "port": port}]}]}}
