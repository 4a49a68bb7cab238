"""``build_*``: the children of one PDPair as plain manifests (dicts). Pure: no client, no clock.

Each manifest carries the owner reference (controller=true, so the garbage collector cascades deletion),
the owner labels the operator watches, and a ``render-hash`` annotation the planner compares to decide
whether a long-lived child (Service, ConfigMap) needs a patch. Pods are never patched: a changed pod is
a new generation (see ``spec.generation_hash``).
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from dataplane import config as agent_config

from . import identity, naming, resources, serving
from .observe import Owner
from .spec import API_VERSION, KIND, PDPairSpec, Role

AGENT_UID = 65532
TERMINATION_GRACE_SECONDS = 10


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION, "kind": KIND, "name": owner.name, "uid": owner.uid,
        "controller": True, "blockOwnerDeletion": True,
    }


def render_hash(manifest: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:12]


def _finish(owner: Owner, manifest: dict[str, Any]) -> dict[str, Any]:
    """Stamp owner reference and render hash (hash over everything else)."""
    meta = manifest["metadata"]
    meta["namespace"] = owner.namespace
    meta["ownerReferences"] = [owner_reference(owner)]
    meta.setdefault("annotations", {})[naming.ANNOTATION_RENDER_HASH] = render_hash(manifest)
    return manifest


def bootstrap_host(owner: Owner, generation: str) -> str:
    return naming.service_dns(naming.bootstrap_service(owner.name, generation), owner.namespace)


PAIRING_KEY_BYTES = 32
PAIRING_KEY_FILE = f"{naming.PAIRING_DIR}/{naming.PAIRING_KEY}"


def build_pairing_secret(owner: Owner, key: bytes) -> dict[str, Any]:
    """The PDPair's pairing key, made once: agents prove they hold it, so a pod of another PDPair (or
    anything else on the pod network) cannot pair. Immutable: a changed key would split running pods
    from new ones; deleting the Secret makes a new key, which pods created afterwards mount."""
    return _finish(owner, {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque", "immutable": True,
        "metadata": {"name": naming.pairing_secret(owner.name),
                     "labels": {**naming.owner_labels(owner.name), naming.LABEL_KIND: "pairing"}},
        "data": {naming.PAIRING_KEY: base64.b64encode(key).decode()},
    })


def build_network_policy(owner: Owner, scraper: dict[str, Any]) -> dict[str, Any]:
    """Default-deny ingress for the PDPair's pods: its own pods reach the bootstrap, control, lane and
    transfer ports (control and lane: one per rank, ``port .. port + TP - 1``), ``scraper`` (a
    NetworkPolicyPeer) the metrics port, nothing else reaches anything.
    Egress is left open (the agents reach their peers, DNS and the API server)."""
    ports, ranks = owner.spec.ports, owner.spec.max_tensor_parallel_size()
    peers = [{"podSelector": {"matchLabels": naming.pod_selector(owner.name)}}]
    tcp: list[dict[str, Any]] = [{"protocol": "TCP", "port": ports.bootstrap}]
    for first in (ports.control, ports.lane):  # rank r listens on port + r
        span = {"endPort": first + ranks - 1} if ranks > 1 else {}
        tcp.append({"protocol": "TCP", "port": first, **span})
    tcp.append({"protocol": "TCP", "port": ports.transfer.first, "endPort": ports.transfer.last})
    return _finish(owner, {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": naming.network_policy(owner.name),
                     "labels": {**naming.owner_labels(owner.name), naming.LABEL_KIND: "isolation"}},
        "spec": {
            "podSelector": {"matchLabels": naming.pod_selector(owner.name)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": peers, "ports": tcp},
                        {"from": [scraper], "ports": [{"protocol": "TCP", "port": ports.metrics}]},
                        *serving.network_policy_rules(owner)],
        },
    })


def build_router_children(owner: Owner, generation: str, network_policy: bool) -> list[dict[str, Any]]:
    """A serving PDPair's router and what it needs (``serving``); none without an sglang engine."""
    if not owner.spec.serves:
        return []
    children = [serving.build_router_service_account(owner), serving.build_router_role(owner),
                serving.build_router_role_binding(owner), serving.build_router_deployment(owner, generation),
                serving.build_router_service(owner), serving.build_router_disruption_budget(owner)]
    if network_policy:
        children.append(serving.build_router_network_policy(owner))
    return [_finish(owner, c) for c in children]


def agent_config_for(owner: Owner, generation: str, role: Role) -> agent_config.AgentConfig:
    """The agent's settings for one role of one generation (listen host and pod name come from flags)."""
    spec, ac = owner.spec, agent_config
    model = spec.model
    return ac.AgentConfig(
        role=role,
        model=ac.ModelConfig(
            name=model.name, profile=model.profile, page_size=model.page_size, dtype=model.dtype,
            pool_pages=model.pool_pages, max_requests=model.max_requests, layers=model.layers,
            kv_item_len=model.kv_item_len,
            kv_layers=model.kv_layers, components=list(model.components),
        ),
        prefill=ac.RoleConfig(spec.prefill.replicas, spec.prefill.tensor_parallel_size,
                              spec.prefill.data_parallel_size),
        decode=ac.RoleConfig(spec.decode.replicas, spec.decode.tensor_parallel_size,
                             spec.decode.data_parallel_size),
        transfer=ac.TransferConfig(
            backend=spec.transfer.backend,
            timeout_seconds=spec.transfer.timeout_seconds,
            heartbeat_interval_seconds=spec.transfer.heartbeat_interval_seconds,
            heartbeat_misses=spec.transfer.heartbeat_misses,
            spin_microseconds=spec.transfer.spin_microseconds,
            coalesce_bytes=spec.transfer.coalesce_bytes,
            device=spec.transfer.device,
            mori=spec.transfer.mori,
            nixl=spec.transfer.nixl,
        ),
        listen=ac.ListenConfig(bootstrap_port=spec.ports.bootstrap, metrics_port=spec.ports.metrics,
                               control_port=spec.ports.control, lane_port=spec.ports.lane),
        peer=ac.PeerConfig(
            bootstrap_host=bootstrap_host(owner, generation),
            bootstrap_port=spec.ports.bootstrap,
        ),
        identity=ac.IdentityConfig(namespace=owner.namespace, pdpair=owner.name, generation=generation),
        localapi=ac.LocalApiConfig(engine=ac.EngineConfig(
            mode="external" if spec.engine.sidecar else "synthetic", socket_path=LOCALAPI_SOCKET,
            reply_spin_microseconds=spec.engine.reply_spin_microseconds)),
        auth=ac.AuthConfig(key_file=PAIRING_KEY_FILE,
                           allow_plain_peers=spec.security.allow_plain_sglang_peers),
    )


def build_config_map(owner: Owner, generation: str) -> dict[str, Any]:
    data = {
        f"{role}.yaml": agent_config.dump_config(agent_config_for(owner, generation, role)).decode()
        for role in ("prefill", "decode")
    }
    return _finish(owner, {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": naming.config_map(owner.name, generation),
                     "labels": {**naming.owner_labels(owner.name), naming.LABEL_KIND: "config",
                                naming.LABEL_GENERATION: generation}},
        "data": data,
    })


def _service(owner: Owner, name: str, child: str, spec: dict[str, Any],
             labels: dict[str, str]) -> dict[str, Any]:
    all_labels = {**naming.owner_labels(owner.name), naming.LABEL_KIND: child, **labels}
    return _finish(owner, {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": all_labels},
        "spec": spec,
    })


def build_bootstrap_service(owner: Owner, generation: str) -> dict[str, Any]:
    """Prefill's bootstrap endpoint for one generation: decode of that generation finds only its prefill.

    Not-ready addresses are published: prefill becomes transfer-ready only after decode reached it.
    With several prefill pods, client-IP affinity keeps each decode pod on one of them: a decode reads
    the topology every heartbeat, and a Service that spread those reads would look like its prefill
    being replaced each time. (A serving decode also pairs with the prefill each request names.)
    """
    port = owner.spec.ports.bootstrap
    return _service(owner, naming.bootstrap_service(owner.name, generation), "bootstrap", {
        "selector": naming.pod_selector(owner.name, "prefill", generation),
        "publishNotReadyAddresses": True,
        "sessionAffinity": "ClientIP",
        "ports": [{"name": "bootstrap", "port": port, "targetPort": port, "protocol": "TCP"}],
    }, {naming.LABEL_GENERATION: generation})


def build_headless_service(owner: Owner) -> dict[str, Any]:
    """Stable per-pod DNS (``<pod>.<name>-pods``) for every generation and role."""
    ports = owner.spec.ports
    return _service(owner, naming.headless_service(owner.name), "headless", {
        "clusterIP": "None",
        "selector": naming.pod_selector(owner.name),
        "publishNotReadyAddresses": True,
        "ports": [{"name": "bootstrap", "port": ports.bootstrap, "protocol": "TCP"},
                  {"name": "metrics", "port": ports.metrics, "protocol": "TCP"}],
    }, {})


def build_metrics_service(owner: Owner) -> dict[str, Any]:
    port = owner.spec.ports.metrics
    return _service(owner, naming.metrics_service(owner.name), "metrics", {
        "selector": naming.pod_selector(owner.name),
        "ports": [{"name": "metrics", "port": port, "targetPort": port, "protocol": "TCP"}],
    }, {})


def agent_command(role: Role) -> list[str]:
    return [
        "pdpair-agent", "run", "--role", role,
        "--config", f"{naming.CONFIG_DIR}/{naming.CONFIG_FILE}",
        "--listen-host", "$(POD_IP)", "--pod-name", "$(POD_NAME)", "--namespace", "$(POD_NAMESPACE)",
    ]


def _env(spec: PDPairSpec, role: Role) -> list[dict[str, Any]]:
    def field(path: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": path}}

    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": field("status.podIP")},
        {"name": "POD_NAME", "valueFrom": field("metadata.name")},
        {"name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace")},
    ]
    if spec.transfer.backend == "nixl":
        transfer = spec.ports.transfer
        env.append({"name": "UCX_TCP_PORT_RANGE", "value": f"{transfer.first}-{transfer.last}"})
    for var in spec.role(role).env:
        entry: dict[str, Any] = {"name": var.name}
        if var.value_from is not None:
            entry["valueFrom"] = var.value_from
        else:
            entry["value"] = var.value or ""
        env.append(entry)
    return env


def _gpu_resources(spec: PDPairSpec, role: Role, on_agent: bool) -> dict[str, Any]:
    """The GPU part of one container's resources. DRA: every container names the pod's claim, so a
    sidecar engine and the agent see the same GPUs. Device plugin: the limit goes to one container
    only, the agent's, or a sidecar engine's (it computes there; the CRD refuses that case when state
    lives in GPU memory, since the agent could not open the engine's CUDA IPC handles)."""
    rs = spec.role(role)
    if rs.gpu_count() == 0:
        return {}
    if rs.resources.dra:
        return {"claims": [{"name": naming.GPU_CLAIM}]}
    if on_agent == spec.engine.sidecar:
        return {}
    return {"limits": {rs.resources.gpu_resource_name: str(rs.gpu_count())}}


def _engine_resources(spec: PDPairSpec, role: Role) -> dict[str, Any]:
    """A sidecar engine's resources: its GPUs (see ``_gpu_resources``), CPU/memory, huge pages
    (``resources.engine_resources``)."""
    return resources.merge(_gpu_resources(spec, role, on_agent=False), resources.engine_resources(spec, role))


def _resources(spec: PDPairSpec, role: Role) -> dict[str, Any]:
    """The agent container's resources: its GPUs (see ``_gpu_resources``), RDMA devices, CPU/memory
    (``resources.agent_resources``)."""
    rdma = spec.role(role).resources.rdma
    devices = {"limits": {rdma.resource_name: str(rdma.count)}} if rdma.count > 0 else {}
    return resources.merge(_gpu_resources(spec, role, on_agent=True), devices,
                           resources.agent_resources(spec, role))


def build_gpu_claim_template(owner: Owner, generation: str, role: Role) -> dict[str, Any] | None:
    """DRA: the template of each pod's GPU claim (``count`` = GPUs per pod), or None where the role
    asks for no DRA GPUs. The ResourceClaim controller makes one claim per pod from it, owned by the
    pod; the scheduler allocates it, and every container that names the claim gets the same devices."""
    rs = owner.spec.role(role)
    if not rs.gpu_claim():
        return None
    claim_labels = {naming.LABEL_NAME: owner.name, naming.LABEL_ROLE: role,
                    naming.LABEL_GENERATION: generation}
    request = {"name": naming.GPU_CLAIM, "exactly": {
        "deviceClassName": rs.resources.gpu_device_class(), "allocationMode": "ExactCount",
        "count": rs.gpu_count()}}
    return _finish(owner, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": naming.gpu_claim_template(owner.name, generation, role),
                     "labels": {**naming.owner_labels(owner.name), naming.LABEL_KIND: "gpus",
                                naming.LABEL_ROLE: role, naming.LABEL_GENERATION: generation}},
        "spec": {"metadata": {"labels": claim_labels},
                 "spec": {"devices": {"requests": [request]}}},
    })


def container_security_context(spec: PDPairSpec) -> dict[str, Any]:
    """Non-root, no escalation, all capabilities dropped; MoRI's RDMA memory pinning needs IPC_LOCK."""
    caps: dict[str, Any] = {"drop": ["ALL"]}
    if spec.transfer.backend == "mori":
        caps["add"] = ["IPC_LOCK"]
    return {
        "runAsNonRoot": True, "runAsUser": AGENT_UID, "runAsGroup": AGENT_UID,
        "allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
        "capabilities": caps, "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container(spec: PDPairSpec, role: Role) -> dict[str, Any]:
    ports = spec.ports
    container: dict[str, Any] = {
        "name": "agent",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": agent_command(role),
        "env": _env(spec, role),
        "ports": [{"name": "bootstrap", "containerPort": ports.bootstrap, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": ports.metrics, "protocol": "TCP"},
                  {"name": "control", "containerPort": ports.control, "protocol": "TCP"},
                  {"name": "lane", "containerPort": ports.lane, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"},
                           "periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 3},
        "securityContext": container_security_context(spec),
        "volumeMounts": [{"name": "agent-config", "mountPath": naming.CONFIG_DIR, "readOnly": True},
                         {"name": "pairing", "mountPath": naming.PAIRING_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    resources = _resources(spec, role)
    if resources:
        container["resources"] = resources
    return container


LOCALAPI_DIR = "/var/run/pdpair"
LOCALAPI_SOCKET = f"{LOCALAPI_DIR}/agent.sock"


def _engine_container(spec: PDPairSpec, role: Role) -> dict[str, Any]:
    """Sidecar mode's engine: the named serving engine, or the synthetic engine (agent image) as the
    transfer canary; either reaches the agent through the socket in the shared ``localapi`` volume."""
    engine = spec.engine
    mounts: list[dict[str, Any]] = [{"name": "localapi", "mountPath": LOCALAPI_DIR}]
    env: list[dict[str, Any]] = [{"name": "PDPAIR_AGENT_SOCKET", "value": LOCALAPI_SOCKET}]
    env += [{"name": v.name, **({"valueFrom": v.value_from} if v.value_from is not None else
                                {"value": v.value or ""})} for v in engine.env]
    container: dict[str, Any] = {"name": "engine", "env": env, "volumeMounts": mounts}
    resources = _engine_resources(spec, role)
    if resources:
        container["resources"] = resources
    if engine.sglang is not None:
        mounts += serving.engine_mounts()
        sglang = serving.sglang_container(spec, engine.sglang, role)
        env += [e for e in sglang.pop("env") if e["name"] not in {v.name for v in engine.env}]
        container.update(image=engine.image, imagePullPolicy=spec.image_pull_policy, **sglang)
        return container
    if engine.image:
        container.update(image=engine.image, imagePullPolicy=spec.image_pull_policy)
        if engine.command:
            container["command"] = list(engine.command)
        if engine.args:
            container["args"] = list(engine.args)
        return container
    mounts += [{"name": "agent-config", "mountPath": naming.CONFIG_DIR, "readOnly": True},
               {"name": "tmp", "mountPath": "/tmp"}]
    container.update(
        image=spec.image, imagePullPolicy=spec.image_pull_policy,
        command=["pdpair-agent", "engine", "--role", role, "--config",
                 f"{naming.CONFIG_DIR}/{naming.CONFIG_FILE}", "--socket", LOCALAPI_SOCKET],
        securityContext=container_security_context(spec),
    )
    return container


def _with_engine(spec: PDPairSpec, role: Role, pod_spec: dict[str, Any]) -> dict[str, Any]:
    """Sidecar mode: the engine container and the ``emptyDir`` holding the local API's socket."""
    if not spec.engine.sidecar:
        return pod_spec
    pod_spec["containers"][0]["volumeMounts"].append({"name": "localapi", "mountPath": LOCALAPI_DIR})
    pod_spec["containers"].append(_engine_container(spec, role))
    pod_spec["volumes"].append({"name": "localapi", "emptyDir": {}})
    if spec.engine.sglang is not None:
        pod_spec["volumes"] += serving.engine_volumes()
    return pod_spec


def build_pod(owner: Owner, generation: str, role: Role, index: int,
              restarts: int = 0, last_failure: str = "") -> dict[str, Any]:
    """One agent pod; ``restarts``/``last_failure`` keep a replaced pod's crash context visible."""
    spec, rs = owner.spec, owner.spec.role(role)
    name = naming.pod_name(owner.name, generation, role, index)
    annotations = {naming.ANNOTATION_RESTARTS: str(restarts), **serving.pod_annotations(spec, role)}
    if last_failure:
        annotations[naming.ANNOTATION_LAST_FAILURE] = last_failure
    pod_spec: dict[str, Any] = {
        "hostname": name,
        "subdomain": naming.headless_service(owner.name),
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "readinessGates": [{"conditionType": naming.TRANSFER_READY}],
        "securityContext": {"runAsNonRoot": True, "runAsUser": AGENT_UID, "runAsGroup": AGENT_UID,
                            "fsGroup": AGENT_UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_container(spec, role)],
        "volumes": [
            {"name": "agent-config", "configMap": {
                "name": naming.config_map(owner.name, generation),
                "items": [{"key": f"{role}.yaml", "path": naming.CONFIG_FILE}]}},
            {"name": "pairing", "secret": {
                "secretName": naming.pairing_secret(owner.name), "defaultMode": 0o400,
                "items": [{"key": naming.PAIRING_KEY, "path": naming.PAIRING_KEY}]}},
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    pod_spec = _with_engine(spec, role, pod_spec)
    if rs.gpu_claim():
        pod_spec["resourceClaims"] = [{
            "name": naming.GPU_CLAIM,
            "resourceClaimTemplateName": naming.gpu_claim_template(owner.name, generation, role)}]
    pod_spec = identity.with_identity(owner, pod_spec)
    if rs.node_selector:
        pod_spec["nodeSelector"] = dict(rs.node_selector)
    if rs.tolerations:
        pod_spec["tolerations"] = list(rs.tolerations)
    if rs.affinity:
        pod_spec["affinity"] = rs.affinity
    return _finish(owner, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": naming.pod_labels(owner.name, generation, role, index),
                     "annotations": annotations},
        "spec": pod_spec,
    })


def build_agent_identity(owner: Owner, cluster_role: str) -> tuple[dict[str, Any], ...]:
    """The agents' ServiceAccount and RoleBinding (``identity.py``), owned and hashed; none where
    ``spec.serviceAccountName`` names the account."""
    if not identity.operator_managed(owner):
        return ()
    return (_finish(owner, identity.build_service_account(owner)),
            _finish(owner, identity.build_role_binding(owner, cluster_role)))
