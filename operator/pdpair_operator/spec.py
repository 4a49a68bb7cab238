"""Typed view of a PDPair's ``spec``, parsed once at the edge of every reconcile.

The API server already applies the CRD's defaults and CEL rules; the defaults are repeated here so the
planner and renderer see the same values when handed a raw dict (tests, an older stored object). The
field names mirror the CRD (camelCase on the wire, snake_case in Python).

``generation_hash`` names a *pod generation*: everything that shapes a pod or its agent's config, and
nothing that only scales (replica counts) or steers the rollout (update strategy). Pods, their
ConfigMap and their bootstrap Service carry it, and agents pair only within one hash.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import msgspec

from dataplane.config import ComponentConfig as Component
from dataplane.config import MoriConfig as Mori
from dataplane.config import NixlConfig as Nixl

GROUP = "pdpair.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PDPair"
PLURAL = "pdpairs"
PROFILES = ("qwen3-next", "deepseek-v3.2", "gpt-oss", "pure-kv", "minimax-m2")
Role = Literal["prefill", "decode"]
ROLES: tuple[Role, Role] = ("prefill", "decode")
# Explicit components and the engines' settings are the agent's own config types, so the CRD's fields,
# the operator's view and the rendered agent config cannot drift apart.


class _Spec(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    pass


class Model(_Spec, frozen=True):
    name: str
    profile: str | None = None
    components: list[Component] = []
    page_size: int = 64
    dtype: str = "bfloat16"
    pool_pages: int = 1024
    max_requests: int = 64
    layers: int = 4
    kv_item_len: int | None = None
    kv_layers: int = 0


class Transfer(_Spec, frozen=True):
    backend: Literal["nixl", "mori"] = "nixl"
    timeout_seconds: float = 30.0
    heartbeat_interval_seconds: float = 1.0
    heartbeat_misses: int = 5
    spin_microseconds: int = 0
    coalesce_bytes: int = 256 << 10
    device: Literal["cpu", "cuda"] = "cpu"
    mori: Mori = Mori()
    nixl: Nixl = Nixl()


class Rdma(_Spec, frozen=True):
    resource_name: str = ""
    count: int = 0


GPU_DEVICE_CLASSES = {"nvidia.com": "gpu.nvidia.com", "amd.com": "gpu.amd.com"}
"""The DeviceClass each vendor's DRA driver installs (NVIDIA k8s-dra-driver-gpu, AMD k8s-gpu-dra-driver),
keyed by the vendor domain of the device plugin's resource name."""


class Resources(_Spec, frozen=True):
    gpu_resource_name: str = "nvidia.com/gpu"
    gpus: int | None = None
    """None: one GPU per tensor-parallel rank."""
    gpu_allocation: Literal["devicePlugin", "dra"] = "devicePlugin"
    """devicePlugin: a ``gpu_resource_name`` limit, which the kubelet gives to one container only.
    dra: a ResourceClaim per pod that every container of the pod references, so a sidecar engine and
    the agent see the same GPUs (the agent opens the engine's CUDA IPC handles)."""
    gpu_device_class_name: str | None = None
    """dra only; None: the vendor's class, from the domain of ``gpu_resource_name``."""
    rdma: Rdma = Rdma()
    cpu: str | None = None
    """The agent container's CPU request; None: derived from its threads (``resources.py``)."""
    memory: str | None = None
    """The agent container's memory request; None: derived from the pools it holds."""
    cpu_limit: str | None = None
    """The agent's CPU limit; None: its request (Guaranteed QoS when every container has both)."""
    memory_limit: str | None = None
    """The agent's memory limit; None: its request."""

    @property
    def dra(self) -> bool:
        return self.gpu_allocation == "dra"

    def gpu_device_class(self) -> str:
        """The DeviceClass GPU claims ask for (the CRD refuses dra without one it can derive)."""
        if self.gpu_device_class_name:
            return self.gpu_device_class_name
        vendor = self.gpu_resource_name.partition("/")[0]
        return GPU_DEVICE_CLASSES.get(vendor, GPU_DEVICE_CLASSES["nvidia.com"])


class EnvVar(_Spec, frozen=True):
    name: str
    value: str | None = None
    value_from: dict[str, Any] | None = None


class RoleSpec(_Spec, frozen=True):
    replicas: int = 1
    tensor_parallel_size: int = 1
    """The engine's TP ranks per pod, all served by the pod's agent (rank r: control + r, lane + r)."""
    data_parallel_size: int = 1
    """DP attention (decode): each rank's attention group is ``tensor_parallel_size / this`` wide."""
    resources: Resources = Resources()
    node_selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    affinity: dict[str, Any] | None = None
    env: list[EnvVar] = []

    def gpu_count(self) -> int:
        return self.tensor_parallel_size if self.resources.gpus is None else self.resources.gpus

    def gpu_claim(self) -> bool:
        """DRA GPUs: each pod gets a ResourceClaim that all its containers reference."""
        return self.resources.dra and self.gpu_count() > 0


class TransferPorts(_Spec, frozen=True):
    """The TCP ports UCX's transfer listener picks from (``UCX_TCP_PORT_RANGE``), so the NetworkPolicy
    can name them."""

    first: int = 20000
    last: int = 20999


class Ports(_Spec, frozen=True):
    bootstrap: int = 8998
    metrics: int = 9400
    control: int = 8999
    lane: int = 9100
    transfer: TransferPorts = TransferPorts()


class Security(_Spec, frozen=True):
    allow_plain_sglang_peers: bool = False
    """Pair also with plain sglang peers, which prove nothing (the agents' ``auth.allowPlainPeers``)."""
    network_policy: bool = True
    """A default-deny NetworkPolicy admitting only this PDPair's pods (and the metrics scraper)."""


class UpdateStrategy(_Spec, frozen=True):
    type: Literal["Coordinated", "Recreate"] = "Coordinated"
    max_surge_units: int = 1
    """Coordinated: how many P:D units of the new generation may exist beyond the ready ones."""


class EngineResources(_Spec, frozen=True):
    """The engine container's requests and limits (Kubernetes quantities); unset: derived for the
    synthetic engine, none for a named image (``resources.py``). ``huge_pages``: 2 MiB huge pages
    (``hugepages-2Mi``, request = limit) for its host pools: copies into ordinary shared pages are
    slower (0.6-0.9 times the rate measured, docs/sidecar.md); Kubernetes requires ``cpu`` or
    ``memory`` beside them. Only for a sidecar engine (the CRD refuses it otherwise)."""

    cpu: str | None = None
    memory: str | None = None
    huge_pages: str | None = None
    cpu_limit: str | None = None
    """None: the CPU request."""
    memory_limit: str | None = None
    """None: the memory request."""


class Sglang(_Spec, frozen=True):
    """sglang as the serving engine (docs/sglang.md): the operator renders ``sglang.launch_server`` with
    the ``pdpair`` transfer backend, the role's TP (and DP attention) sizes and these settings; ``args``
    are appended as given (quantization, memory fraction, ...)."""

    model_path: str
    port: int = 30000
    """The engine's HTTP port: the router's requests and the health probes."""
    args: list[str] = []
    startup_seconds: int = 1800
    """How long loading the weights may take before the kubelet restarts the engine."""


class Engine(_Spec, frozen=True):
    """The serving engine beside the agent (docs/sidecar.md). ``inProcess`` (default): the agent's own
    synthetic source is the canary. ``sidecar``: a second container speaks the local API to the agent
    over a socket in a shared ``emptyDir`` — ``image`` (with ``command``/``args``/``env``) names the
    serving engine; without one the synthetic engine runs there, from the agent image. ``sglang``
    (with ``image``, an sglang image holding PDPair's plugin): the operator writes the engine's command."""

    mode: Literal["inProcess", "sidecar"] = "inProcess"
    image: str | None = None
    command: list[str] = []
    args: list[str] = []
    env: list[EnvVar] = []
    resources: EngineResources = EngineResources()
    reply_spin_microseconds: int = 200
    """The sidecar agent's ``localapi.engine.replySpinMicroseconds``."""
    sglang: Sglang | None = None
    security_context: dict[str, Any] | None = None
    """A named engine image's container securityContext (default: restricted, ``identity.py``)."""

    @property
    def sidecar(self) -> bool:
        return self.mode == "sidecar" or bool(self.image) or self.sglang is not None


class Router(_Spec, frozen=True):
    """The PD router in front of an sglang pair (sglang-router in PD mode, from the engine's image by
    default). It discovers the current generation's prefill and decode pods through the API server, so
    pods coming and going need no operator action; one Service fronts it."""

    enabled: bool = True
    image: str | None = None
    replicas: int = 1
    port: int = 8000
    policy: Literal["random", "round_robin", "cache_aware", "power_of_two"] = "cache_aware"
    args: list[str] = []
    cpu: str = "1"
    memory: str = "1Gi"


class PDPairSpec(_Spec, frozen=True):
    model: Model
    image: str
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    service_account_name: str | None = None
    transfer: Transfer = Transfer()
    prefill: RoleSpec = RoleSpec()
    decode: RoleSpec = RoleSpec()
    ports: Ports = Ports()
    update_strategy: UpdateStrategy = UpdateStrategy()
    engine: Engine = Engine()
    router: Router = Router()
    security: Security = Security()

    def role(self, role: Role) -> RoleSpec:
        return self.prefill if role == "prefill" else self.decode

    @property
    def layout_from_engine(self) -> bool:
        """No layout in the spec: the engine registers its pools and the agents adopt their layout."""
        return self.model.profile is None and not self.model.components and bool(self.engine.image)

    @property
    def serves(self) -> bool:
        """An sglang pair with its router: the PDPair serves requests, not only the canary."""
        return self.engine.sglang is not None and self.router.enabled

    def max_tensor_parallel_size(self) -> int:
        """The most ranks one pod's agent serves, so the most control and lane ports it listens on."""
        return max(self.prefill.tensor_parallel_size, self.decode.tensor_parallel_size)


class SpecError(ValueError):
    """The stored spec does not parse (the CRD should have refused it)."""


def parse_spec(raw: dict[str, Any]) -> PDPairSpec:
    try:
        return msgspec.convert(raw, type=PDPairSpec)
    except msgspec.ValidationError as exc:
        raise SpecError(f"invalid PDPair spec: {exc}") from exc


def generation_hash(spec: PDPairSpec) -> str:
    """8 hex digits over the pod-shaping part of the spec (replicas, update strategy, the router and
    the NetworkPolicy switch excluded)."""
    shaped = msgspec.structs.replace(
        spec,
        prefill=msgspec.structs.replace(spec.prefill, replicas=0),
        decode=msgspec.structs.replace(spec.decode, replicas=0),
        update_strategy=UpdateStrategy(),
        router=Router(),
        security=msgspec.structs.replace(spec.security, network_policy=True),
    )
    return hashlib.sha256(msgspec.json.encode(shaped, order="sorted")).hexdigest()[:8]
