"""CPU, memory and ephemeral-storage requests and limits of a pod's agent and engine containers,
derived from what each container holds and runs, so the scheduler places pods by the pools they pin
and the kubelet does not evict them first. Pure: the renderer merges these with the GPU and RDMA
parts (``render._gpu_resources``); ``problems`` is the planner's check of the quantities a spec names.

A limit equals its request unless the spec names a larger one: a pod whose containers all have CPU
and memory requests equal to limits is Guaranteed (the last the kubelet evicts under memory pressure;
whole cores under the static CPU manager). The formula (docs/operator.md, "Resources"):

- agent memory = ``AGENT_BASE_MEMORY`` + the host pools of its rank (the one rank the pod's agent
  serves, ``render.agent_command``; transfer.device cpu: the pools' regions from the model profile or
  components, each rounded up to 2 MiB; in sidecar mode the engine's shared pools unless they fit the
  engine's huge pages, since decode's agent may be the first to touch a page and shared memory is
  charged to whoever touches it first) + host staging buffers
  (``transfer.staged``) + ``CUDA_HOST_MEMORY`` when the pools are on the GPU;
- agent CPU = one core for the role worker, one for the posting thread (prefill on host memory, NIXL
  ``postThread``) or NIXL's ``numThreads``, one for UCX's progress thread where it runs, and MoRI's
  ``numWorkerThreads``;
- synthetic sidecar engine: ``ENGINE_BASE_MEMORY`` + its host pools unless they fit ``hugePages``
  (+ ``CUDA_HOST_MEMORY`` with GPU pools), one core;
  a named engine image: what ``engine.resources`` says, nothing derived (its needs are the engine's).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from dataplane.config import AgentConfig, ModelConfig, RoleConfig, TransferConfig
from dataplane.schema.profiles import schema_from_config

from .quantity import GI, MI, BadQuantity, cpu_cores, format_bytes, format_cores, quantity_bytes
from .spec import ROLES, PDPairSpec, Role

__all__ = [
    "AGENT_BASE_MEMORY",
    "CUDA_HOST_MEMORY",
    "ENGINE_BASE_MEMORY",
    "agent_resources",
    "engine_resources",
    "host_pool_bytes",
    "merge",
    "pool_config",
    "problems",
]

AGENT_BASE_MEMORY = 512 * MI
"""The agent process without its pools (Python, numpy, NIXL/UCX, ZMQ, its threads): 212 MiB resident
(VmHWM) per agent in ``pdpair-agent demo --profile pure-kv`` on host memory with 64 MiB of pools
touched; the rest is room for UCX's registration caches and bounce buffers on RDMA NICs."""
CUDA_HOST_MEMORY = 2 * GI
"""Host memory of torch and the CUDA context in an agent whose pools are on the GPU (not measured
here, where there is no GPU: the size commonly seen for one CUDA context with torch loaded)."""
ENGINE_BASE_MEMORY = 512 * MI
"""The synthetic engine process without its pools (Python, numpy, the local API)."""
EPHEMERAL_REQUEST = 256 * MI
EPHEMERAL_LIMIT = GI
"""Ephemeral storage of the agent and the synthetic engine: their logs (the kubelet rotates them at
10 MiB x 5 by default) and ``/tmp``."""
HUGE_PAGE = 2 * MI


def _ceil(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def pool_config(spec: PDPairSpec, role: Role) -> AgentConfig:
    """The part of the role's agent config that shapes its pools and threads (the rest of
    ``render.agent_config_for`` names addresses and identities, which size nothing)."""
    m, t = spec.model, spec.transfer
    return AgentConfig(
        role=role,
        model=ModelConfig(name=m.name, profile=m.profile, page_size=m.page_size, dtype=m.dtype,
                          pool_pages=m.pool_pages, max_requests=m.max_requests, kv_item_len=m.kv_item_len,
                          kv_layers=m.kv_layers, components=list(m.components)),
        prefill=RoleConfig(spec.prefill.replicas, spec.prefill.tensor_parallel_size,
                           spec.prefill.data_parallel_size),
        decode=RoleConfig(spec.decode.replicas, spec.decode.tensor_parallel_size,
                          spec.decode.data_parallel_size),
        transfer=TransferConfig(backend=t.backend, device=t.device, mori=t.mori, nixl=t.nixl),
    ).attention_view()


def _regions(cfg: AgentConfig) -> list[int]:
    return [region.size for region in schema_from_config(cfg).regions()]


def host_pool_bytes(cfg: AgentConfig) -> int:
    """Host memory of one rank's pools, each region rounded up to a 2 MiB huge page; 0 on the GPU."""
    if cfg.transfer.device != "cpu":
        return 0
    return sum(_ceil(size, HUGE_PAGE) for size in _regions(cfg))


def _host_staging_bytes(cfg: AgentConfig) -> int:
    """The staged path's buffers when they are in host memory (they live where the pools do):
    prefill one set, decode one per prefill rank it pulls from."""
    staged, t = cfg.transfer.staged, cfg.transfer
    on = staged.mode == "on" or (staged.mode == "auto" and t.device == "cuda" and t.backend != "cuda-ipc")
    if not on or t.device != "cpu":
        return 0
    sets = 1 if cfg.role == "prefill" else max(1, cfg.prefill.tp_size // cfg.decode.tp_size)
    return sets * staged.slots * staged.slot_bytes


def _pools_in_huge_pages(spec: PDPairSpec, cfg: AgentConfig) -> bool:
    """The sidecar engine takes its pools from huge pages only where all of them fit (every rank's)."""
    huge = spec.engine.resources.huge_pages
    ranks = cfg.prefill.tp_size if cfg.role == "prefill" else cfg.decode.tp_size
    return bool(huge) and quantity_bytes(huge or "0") >= host_pool_bytes(cfg) * ranks


def agent_memory_bytes(spec: PDPairSpec, role: Role) -> int:
    """One agent serves every rank of its pod: its base once, each rank's pools and staging."""
    cfg = pool_config(spec, role)
    ranks = spec.role(role).tensor_parallel_size
    if spec.layout_from_engine:
        pools = 0  # the engine's own pools: it allocates and faults them in, so its container pays
    else:
        pools = host_pool_bytes(cfg)
        if spec.engine.sidecar and _pools_in_huge_pages(spec, cfg):
            pools = 0
    cuda = CUDA_HOST_MEMORY if cfg.transfer.device == "cuda" else 0
    return _ceil(AGENT_BASE_MEMORY + ranks * (pools + _host_staging_bytes(cfg)) + cuda, MI)


def agent_cores(spec: PDPairSpec, role: Role) -> int:
    """Threads of the agent that run busy while rooms move: each rank of the pod has its own."""
    return spec.role(role).tensor_parallel_size * _rank_cores(spec, role)


def _rank_cores(spec: PDPairSpec, role: Role) -> int:
    t = spec.transfer
    cores = 1  # the role worker
    if t.backend == "mori":
        return cores + t.mori.num_worker_threads
    nixl = t.nixl.for_role(role, t.device)
    if nixl.num_threads > 0:
        cores += nixl.num_threads
    elif nixl.post_thread and t.device == "cpu" and role == "prefill":
        cores += 1  # the posting thread: only prefill posts writes, only host copies run on it
    if nixl.progress_thread:
        cores += 1
    return cores


def _requirements(cpu: str | None, memory: str | None, cpu_limit: str | None,
                  memory_limit: str | None, extra: dict[str, str]) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    limits = {k: v for k, v in (("cpu", cpu_limit or cpu), ("memory", memory_limit or memory)) if v}
    out: dict[str, Any] = {}
    if requests or extra:
        out["requests"] = {**requests, **extra}
    if limits or extra:
        out["limits"] = {**limits, **extra}
    return out


def _ephemeral() -> dict[str, Any]:
    return {"requests": {"ephemeral-storage": format_bytes(EPHEMERAL_REQUEST)},
            "limits": {"ephemeral-storage": format_bytes(EPHEMERAL_LIMIT)}}


def merge(*parts: dict[str, Any]) -> dict[str, Any]:
    """Container ``resources`` from parts: ``requests`` and ``limits`` maps merged, ``claims`` joined."""
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if key == "claims":
                out["claims"] = out.get("claims", []) + list(value)
            else:
                out[key] = {**out.get(key, {}), **value}
    return out


def _derived_cpu(cores: int, limit: str | None) -> str:
    """A derived CPU request, at most the limit the spec names (the API server refuses more)."""
    return limit if limit is not None and cpu_cores(limit) < cores else format_cores(cores)


def _derived_memory(n: int, limit: str | None) -> str:
    return limit if limit is not None and quantity_bytes(limit) < n else format_bytes(n)


def agent_resources(spec: PDPairSpec, role: Role) -> dict[str, Any]:
    """The agent container's CPU, memory and ephemeral storage: the spec's where it names them
    (``<role>.resources.cpu`` ...), derived otherwise."""
    res = spec.role(role).resources
    cpu = res.cpu or _derived_cpu(agent_cores(spec, role), res.cpu_limit)
    memory = res.memory or _derived_memory(agent_memory_bytes(spec, role), res.memory_limit)
    return merge(_requirements(cpu, memory, res.cpu_limit, res.memory_limit, {}), _ephemeral())


def engine_resources(spec: PDPairSpec, role: Role) -> dict[str, Any]:
    """A sidecar engine's CPU, memory and huge pages (request = limit, as Kubernetes requires for
    huge pages): derived for the synthetic engine, only what ``engine.resources`` names for an image."""
    res = spec.engine.resources
    huge = {"hugepages-2Mi": res.huge_pages} if res.huge_pages else {}
    if spec.engine.image:
        return _requirements(res.cpu, res.memory, res.cpu_limit, res.memory_limit, huge)
    cfg = pool_config(spec, role)
    ranks = spec.role(role).tensor_parallel_size  # the synthetic engine runs one process per rank
    pools = 0 if _pools_in_huge_pages(spec, cfg) else host_pool_bytes(cfg)
    cpu = res.cpu or _derived_cpu(ranks, res.cpu_limit)
    cuda = CUDA_HOST_MEMORY if cfg.transfer.device == "cuda" else 0
    memory = res.memory or _derived_memory(
        _ceil(ranks * (ENGINE_BASE_MEMORY + pools + cuda), MI), res.memory_limit)
    return merge(_requirements(cpu, memory, res.cpu_limit, res.memory_limit, huge), _ephemeral())


def _pairs(spec: PDPairSpec) -> list[tuple[str, str | None, str | None, str]]:
    """(setting, request, limit, kind) for every request/limit pair a spec can name."""
    out = []
    for role in ROLES:
        r = spec.role(role).resources
        out += [(f"{role}.resources.cpu", r.cpu, r.cpu_limit, "cpu"),
                (f"{role}.resources.memory", r.memory, r.memory_limit, "bytes")]
    e = spec.engine.resources
    out += [("engine.resources.cpu", e.cpu, e.cpu_limit, "cpu"),
            ("engine.resources.memory", e.memory, e.memory_limit, "bytes"),
            ("engine.resources.hugePages", e.huge_pages, None, "bytes"),
            ("router.cpu", spec.router.cpu, None, "cpu"),
            ("router.memory", spec.router.memory, None, "bytes")]
    return out


def problems(spec: PDPairSpec) -> tuple[str, str] | None:
    """(reason, message) for a quantity that does not parse or a limit below its request, else None.
    The CRD's rules refuse both at ``kubectl apply``; this covers a spec that bypassed them."""
    for setting, request, limit, kind in _pairs(spec):
        limit_setting = setting.replace(".cpu", ".cpuLimit").replace(".memory", ".memoryLimit")
        values: list[Decimal | int] = []
        for name, text in ((setting, request), (limit_setting, limit)):
            if text is None:
                continue
            try:
                values.append(cpu_cores(text) if kind == "cpu" else quantity_bytes(text))
            except BadQuantity:
                return "BadQuantity", (
                    f"{name}: {text!r} is not a Kubernetes quantity (for example "
                    f"{'8 or 500m' if kind == 'cpu' else '64Gi'})")
        if request is not None and limit is not None and values[1] < values[0]:
            return "LimitBelowRequest", (
                f"{limit_setting} ({limit}) is below {setting} ({request}); raise the limit or unset it "
                "(it then equals the request)")
    return None
