"""The agent's settings: one typed object, parsed once at the edge (CLI / mounted config file).

The operator renders exactly this document (YAML or JSON) into the pod's ConfigMap, so the operator
imports this module too: it must stay free of numpy, torch and the engines. Library code receives an
``AgentConfig`` and never reads environment variables itself.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from .errors import BadInput

Role = Literal["prefill", "decode"]
Backend = Literal["nixl", "mori", "cuda-ipc"]
FORMAT_VERSION = 1
MIN_KEY_BYTES = 32
MAX_RANKS = 64


class _Base(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    pass


class ComponentConfig(_Base, frozen=True):
    """An explicit state component (when no model profile names the layout)."""

    name: str
    state_type: str
    item_lens: list[int]
    num_items: int
    tp_dims: list[int] = []
    layer_ids: list[int] = []
    dtype: str = "bfloat16"


class ModelConfig(_Base, frozen=True):
    name: str = "synthetic"
    profile: str | None = "qwen3-next"
    """A built-in model profile (``dataplane.schema.profiles``); None means ``components`` is explicit."""
    page_size: int = 64
    dtype: str = "bfloat16"
    pool_pages: int = 1024
    """KV pages (and paged-state pages) each rank allocates."""
    max_requests: int = 64
    """Slots for per-request state (mamba, aux)."""
    layers: Annotated[int, msgspec.Meta(ge=0, le=4096)] = 4
    """Profile mode only: the synthetic source (or engine) lays out the model's first ``layers`` layers,
    each at its real size (4 hold every profile's layer pattern, e.g. Qwen3-Next's 3 GDN + 1 full
    attention, in a few hundred MB); 0: every layer of the model."""
    prefault: bool = False
    """Touch every page of host pools at start-up, as a serving engine's long-lived cache is, so no
    room pays first-touch page faults (benchmarks set it); off, pages are mapped on first use."""
    kv_item_len: int | None = None
    """Explicit-components mode only: bytes of one KV page of one buffer."""
    kv_layers: int = 0
    components: list[ComponentConfig] = []


class RoleConfig(_Base, frozen=True):
    replicas: int = 1
    tp_size: int = 1
    """The engine's TP size: its scheduler processes (ranks) per pod, all served by the pod's agent."""
    dp_size: int = 1
    """DP attention (decode): the attention TP group of a rank is ``tpSize / dpSize`` ranks wide."""


class MoriConfig(_Base, frozen=True):
    rdma_devices: list[str] = []
    qp_per_transfer: int = 1
    post_batch_size: int = -1
    num_worker_threads: int = 1
    poll_cq_mode: Literal["polling", "event"] = "polling"


class NixlConfig(_Base, frozen=True):
    backends: tuple[str, ...] = ("UCX",)
    ucx_tls: str | None = None
    """Value for UCX_TLS (e.g. ``tcp``); None keeps UCX's default (CMA / shared memory on one host)."""
    ucx_net_devices: str | None = None
    """Value for UCX_NET_DEVICES (``lo`` pins UCX to loopback). None: the interface holding
    ``listen.host`` and the host's RDMA ports, so UCX's TCP transport listens only on the agent's
    address (``transports.netdevs``); UCX's default (every device) where no interface holds it."""
    num_threads: Annotated[int, msgspec.Meta(ge=0, le=64)] = 0
    """NIXL's own backend threads (``num_threads``, with every request handed to them: UCX's
    ``split_batch_size`` 1). A post then returns once the thread has issued the writes and the copy
    runs there, without the GIL; ``post_thread`` is then off. On a 16-core host, eight rooms in
    flight, 1 MiB rooms ran 21% faster in one call and 22% slower in another, the qwen3-next mix
    25-40% slower (a post waits while the thread copies an earlier request) and lone rooms slower
    (completion is polled, never signalled): off by default (0)."""
    post_thread: bool = True
    """Host memory: post writes (``postXferReq``) from a thread of their own. UCX copies a host write
    inside that call, so posted on the role worker the room's copy and the next rooms' control work
    run one after the other; on their own thread they overlap (the binding releases the GIL during
    the copy). Only batches over 256 KiB posted while another transfer is running go there: a room
    alone in flight gains nothing from the hand-off. Off for agents whose pools are on the GPU
    (``transfer.device: cuda``), whose copies run on the GPU."""
    native_poster: bool = True
    """With ``post_thread``: the posting thread is native (``transports/nixl/native``, built with the host's
    C++ compiler on first use): it posts, polls and signals finished transfers without the GIL, and
    the role worker sleeps until it signals instead of polling. Falls back to the Python posting
    thread, with a warning saying why, where it cannot be built or loaded."""
    progress_thread: bool | None = None
    """NIXL's UCX progress thread. Unset: off on prefill with host memory, on elsewhere (``for_role``;
    GPU pools were not measured without it). Prefill only initiates writes, and its worker and
    posting thread progress them when they post and poll; the thread there only took UCX's worker
    lock from under them (py-spy: the posting thread spun 7-8% of its time on that lock). Off, on a
    16-core host with eight rooms in flight (two alternating rounds): prefill's worker CPU per 1 MiB
    room 249 / 232 against 309 / 293 µs, 1 MiB rooms 6.4 / 7.5 against 6.6 / 5.7 GB/s, the qwen3-next
    mix 4.6 / 5.0 against 4.2 / 3.5. Decode (the target) keeps it: it must answer UCX's wire-up and,
    over TCP, receive the writes."""
    progress_delay_us: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 100
    """The UCX progress thread's sleep between event checks; 0 = NIXL's Python default, a busy spin
    that keeps one core per agent at 100% even when idle."""

    def for_role(self, role: str, device: str = "cpu") -> NixlConfig:
        """This config with an unset ``progress_thread`` decided: off for a prefill on host memory
        (which only initiates writes), on otherwise (GPU pools: not measured without it)."""
        if self.progress_thread is not None:
            return self
        return msgspec.structs.replace(self, progress_thread=not (role == "prefill" and device == "cpu"))


class StagedConfig(_Base, frozen=True):
    """The staged path (docs/gpu.md): a component whose mean write is under ``thresholdBytes`` is
    gathered into a registered staging slot, written once, and scattered by decode. Each side holds
    ``slots`` slots of ``slotBytes`` (decode one set per prefill rank it pulls from)."""

    mode: Literal["auto", "on", "off"] = "auto"
    """``auto``: staged when the pools are in GPU memory; ``on``: also in host memory; ``off``: never."""
    threshold_bytes: int = 512 << 10
    min_writes: int = 256
    """A component is staged only with at least this many writes in the request: each staged piece
    costs a fixed round (2-3 ms measured on an H200) that only many per-write costs repay."""
    slot_bytes: int = 64 << 20
    slots: int = 4
    kernel: Literal["torch", "triton"] = "torch"
    """GPU gather / scatter kernel (host memory always uses numpy)."""


class TransferConfig(_Base, frozen=True):
    backend: Backend = "nixl"
    timeout_seconds: float = 30.0
    heartbeat_interval_seconds: float = 1.0
    heartbeat_misses: int = 5
    spin_microseconds: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 0
    """After each message, send or running transfer, the role worker polls without sleeping for this
    long before it blocks again: a sleeping thread's wake-up (and a timer's 50 µs slack) is a large
    share of a small request's latency. Costs up to that much CPU per request, and threads that spin
    take cores from the engine's own (1 MiB rooms, eight in flight, on the 16-core host: 7.2 → 4.2 GB/s
    with 200 µs); 0: never spin."""
    coalesce_bytes: Annotated[int, msgspec.Meta(ge=0, le=64 << 20)] = 256 << 10
    """Rooms that become ready together (messages handled in one turn of the worker) and go to the
    same decode as one engine request each, of at most this many bytes, share one engine request:
    an engine request's fixed cost (NIXL: descriptors, post, poll, release) is paid once for all.
    Each room still completes and is reported on its own; a failed shared request fails them all.
    0: every room posts its own."""
    device: Literal["cpu", "cuda"] = "cpu"
    gpu_id: int = 0
    mori: MoriConfig = MoriConfig()
    nixl: NixlConfig = NixlConfig()
    staged: StagedConfig = StagedConfig()


class ListenConfig(_Base, frozen=True):
    host: str = "127.0.0.1"
    """Address every listener binds (the pod IP in a pod; never 0.0.0.0 by default)."""
    bootstrap_port: int = 8998
    control_port: int = 0
    """ZMQ control socket; 0 picks a free port (advertised through the bootstrap endpoint)."""
    lanes: bool = True
    """Control frames between two of our agents on a direct TCP lane once paired (ZMQ's I/O threads
    cost most of a request's latency); off: ZMQ only, as with a plain sglang peer."""
    lane_port: int = 0
    """The lane listener's port; 0 picks a free one (advertised in the pairing ``Hello``)."""
    metrics_port: int = 9400


class PeerConfig(_Base, frozen=True):
    bootstrap_host: str = "127.0.0.1"
    """Decode only: the prefill bootstrap address (the bootstrap Service in a cluster)."""
    bootstrap_port: int = 8998
    max_prefills: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 16
    """Decode only: the most prefill pods it pairs with at once — the configured one and those its
    engine names by bootstrap address (``Expect.bootstrap_addr``: sglang's router picks a prefill per
    request). A room naming one more fails with the reason, unless a named pod has been idle for a
    transfer timeout (it is then forgotten)."""


class IdentityConfig(_Base, frozen=True):
    namespace: str = ""
    pdpair: str = ""
    generation: str = ""
    """Spec generation hash: agents pair only with peers of the same generation."""
    pod_name: str = ""


class SyntheticConfig(_Base, frozen=True):
    """The synthetic source's (or engine's) request stream, which decode originates (a canary in pods,
    the load in the demo and benchmarks)."""

    enabled: bool = True
    requests_per_second: float = 1.0
    """Canary rate; 0 = as fast as ``maxInflight`` allows."""
    requests: int = 0
    """Stop after this many requests; 0 = run until stopped."""
    tokens: tuple[int, ...] = (1024,)
    """Token lengths of successive requests, cycled; 0 = an all-empty request."""
    max_inflight: int = 4
    warmup: int = 0
    """The first rooms left out of the transfer statistics (``/status`` components, window, latency):
    they pay one-time costs (connection wire-up, prepared descriptor lists, first-touch page faults)
    that a benchmark's raw-engine baseline also leaves out. Metrics still count them."""
    verify: bool = True
    """Decode checks every received byte against the deterministic fill; false also skips prefill's
    fill (benchmarks measure the transfer alone)."""
    room_base: Annotated[int, msgspec.Meta(ge=0, le=1 << 62)] | None = None
    """Decode: the first room id (then one up per request); unset: random. The ranks of one attention
    group take the same rooms, as an engine's TP ranks serve the same requests (the pod sets it)."""


class EngineConfig(_Base, frozen=True):
    """Who owns the pools and the requests: the agent's own synthetic source (``synthetic``), or a
    serving engine in the next container that speaks the local API (``external``, sidecar mode)."""

    mode: Literal["synthetic", "external"] = "synthetic"
    socket_path: str = "/var/run/pdpair/agent.sock"
    """The local API's Unix socket, in a volume the engine's and the agent's containers share."""
    max_frame_bytes: int = 4 << 20
    allowed_uids: list[int] = []
    """The uids whose processes may use the local API socket (checked on connect, ``SO_PEERCRED``);
    empty: the agent's own uid (engine and agent containers run as the same user)."""
    socket_group: int | None = None
    """A gid for the socket file, which that group may then open too (mode 0660); unset: 0600."""
    reply_spin_microseconds: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 200
    """After pushing the engine a state it answers (a room finished; prefill: decode asked for a room),
    the role worker polls without sleeping this long for the answer (the next ``Expect`` or ``Send``):
    a serving engine's scheduler loop polls without sleeping, so its answer comes within tens of µs,
    and a sleeping worker's wake-up (50-85 µs on the benchmark hosts) would cost more than that. At
    most this much CPU per push; 0: never spin. Only in ``external`` mode."""
    huge_pages: Literal["auto", "always", "never"] = "auto"
    """Where the synthetic engine process takes its host pools: reserved 2 MiB huge pages when the
    host (or the container's ``hugepages-2Mi``) has enough (``auto``), only there (``always``), or
    ordinary shared pages (``never``). Copies into ordinary shared pages are slower (0.6-0.9 times the
    rate on the hosts measured)."""


class AuthConfig(_Base, frozen=True):
    """Who may pair with this agent and steer it: peers prove they hold the PDPair's shared key."""

    key_file: str | None = None
    """The PDPair's pairing key (the operator mounts the PDPair's Secret here, in the agent's container
    only). The handshake proves possession of it without sending it."""
    allow_plain_peers: bool = False
    """Also pair with plain sglang peers, which send no proof of the key (the PDPair's
    ``security.allowPlainSglangPeers``)."""

    def read_key(self) -> bytes | None:
        """The pairing key's bytes (None without ``keyFile``); a missing, unreadable or short file is
        the user's mistake, named with its fix."""
        if self.key_file is None:
            return None
        try:
            key = Path(self.key_file).read_bytes()
        except OSError as exc:
            raise BadInput(
                f"auth.keyFile {self.key_file}: cannot read it ({exc.strerror}); mount the PDPair's "
                "pairing Secret there or fix the path"
            ) from None
        if len(key) < MIN_KEY_BYTES:
            raise BadInput(
                f"auth.keyFile {self.key_file}: {len(key)} bytes, a pairing key has at least "
                f"{MIN_KEY_BYTES} (make one with: head -c 32 /dev/urandom > {self.key_file})"
            )
        return key


class LocalApiConfig(_Base, frozen=True):
    engine: EngineConfig = EngineConfig()


class AgentConfig(_Base, frozen=True):
    format_version: int = FORMAT_VERSION
    role: Role = "prefill"
    tp_rank: int = 0
    model: ModelConfig = ModelConfig()
    prefill: RoleConfig = RoleConfig()
    decode: RoleConfig = RoleConfig()
    transfer: TransferConfig = TransferConfig()
    listen: ListenConfig = ListenConfig()
    peer: PeerConfig = PeerConfig()
    identity: IdentityConfig = IdentityConfig()
    synthetic: SyntheticConfig = SyntheticConfig()
    localapi: LocalApiConfig = LocalApiConfig()
    auth: AuthConfig = AuthConfig()

    @property
    def tp_size(self) -> int:
        return self.prefill.tp_size if self.role == "prefill" else self.decode.tp_size

    @property
    def dp_size(self) -> int:
        return self.prefill.dp_size if self.role == "prefill" else self.decode.dp_size

    def check_ranks(self) -> None:
        """The role's TP and DP sizes are ones an agent can serve (``BadInput`` naming the fix)."""
        role = self.prefill if self.role == "prefill" else self.decode
        where = f"{self.role}.tpSize {role.tp_size} / {self.role}.dpSize {role.dp_size}"
        if not 1 <= role.tp_size <= MAX_RANKS or role.tp_size & (role.tp_size - 1):
            raise BadInput(f"{where}: tpSize must be a power of two from 1 to {MAX_RANKS}")
        if role.dp_size < 1 or role.tp_size % role.dp_size:
            raise BadInput(f"{where}: dpSize must divide tpSize")
        if self.role == "prefill" and role.dp_size != 1:
            raise BadInput(f"{where}: DP attention is served on decode only; set prefill.dpSize 1")
        if not 0 <= self.tp_rank < role.tp_size:
            raise BadInput(f"tpRank {self.tp_rank} outside {self.role}.tpSize {role.tp_size}")

    def for_rank(self, rank: int) -> AgentConfig:
        """The config of one rank of this pod: ``tp_rank`` set, fixed control and lane ports moved up
        by the rank (0, any free port, stays 0), so a pod's ranks use ``port .. port + tpSize - 1``."""
        listen = self.listen
        listen = msgspec.structs.replace(
            listen,
            control_port=listen.control_port + rank if listen.control_port else 0,
            lane_port=listen.lane_port + rank if listen.lane_port else 0,
        )
        return msgspec.structs.replace(self, tp_rank=rank, listen=listen)

    def attention_view(self) -> AgentConfig:
        """The config as the schema sees its rank: TP size and rank of the attention group (DP
        attention splits the KV heads over ``tpSize / dpSize`` ranks, sglang's ``attn_tp_size``)."""
        if self.dp_size == 1:
            return self
        attn = self.tp_size // self.dp_size
        field = "prefill" if self.role == "prefill" else "decode"
        group = msgspec.structs.replace(getattr(self, field), tp_size=attn, dp_size=1)
        return msgspec.structs.replace(self, tp_rank=self.tp_rank % attn, **{field: group})

    def with_engine(self, **changes: Any) -> AgentConfig:
        """This config with ``localapi.engine``'s fields in ``changes`` replaced, the others kept."""
        engine = msgspec.structs.replace(self.localapi.engine, **changes)
        return msgspec.structs.replace(self, localapi=msgspec.structs.replace(self.localapi, engine=engine))


def parse_config(data: bytes | str, *, source: str = "<config>") -> AgentConfig:
    """Parse YAML or JSON into an ``AgentConfig``; errors name the field and the source."""
    try:
        if isinstance(data, str):
            data = data.encode()
        text = data.lstrip()
        if text.startswith(b"{"):
            cfg = msgspec.json.decode(data, type=AgentConfig)
        else:
            cfg = msgspec.yaml.decode(data, type=AgentConfig)
    except msgspec.ValidationError as exc:
        raise BadInput(f"{source}: invalid agent config: {exc}{_did_you_mean(str(exc))}") from exc
    except msgspec.DecodeError as exc:
        raise BadInput(f"{source}: not valid YAML/JSON: {exc}") from exc
    if cfg.format_version != FORMAT_VERSION:
        raise BadInput(
            f"{source}: config formatVersion {cfg.format_version}, this agent reads {FORMAT_VERSION}"
        )
    return cfg


def load_config(path: str | Path) -> AgentConfig:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise BadInput(
            f"{p}: cannot read the agent config ({exc.strerror}); give the path of a readable YAML or "
            "JSON file"
        ) from None
    return parse_config(data, source=str(p))


_UNKNOWN = re.compile(r"unknown field `([^`]*)`(?: - at `([^`]*)`)?")
_STEP = re.compile(r"\.([^.\[]+)|\[[^\]]*\]")


def _did_you_mean(message: str) -> str:
    """For msgspec's "unknown field `k` - at `$.a.b`": the nearest key that exists at that path
    (``pagesize`` -> ``pageSize``), else the keys there; "" for any other message."""
    import difflib

    from msgspec import inspect

    found = _UNKNOWN.search(message)
    if not found:
        return ""
    key, path = found.group(1), found.group(2) or "$"
    info: Any = inspect.type_info(AgentConfig)
    for step in _STEP.finditer(path.removeprefix("$")):
        info = _unwrap(info)
        if step.group(1) is None:
            info = getattr(info, "item_type", None)
        else:
            fields = {f.encode_name: f.type for f in getattr(info, "fields", ())}
            info = fields.get(step.group(1))
    info = _unwrap(info)
    names = [f.encode_name for f in getattr(info, "fields", ())]
    if not names:
        return ""
    lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(key.lower(), list(lower), n=1, cutoff=0.6)
    if close:
        return f"; did you mean `{lower[close[0]]}`?"
    return f"; keys there: {', '.join(names)}"


def _unwrap(info: Any) -> Any:
    """The non-None member of an optional type (``Struct | None``), else ``info`` itself."""
    from msgspec import inspect

    if isinstance(info, inspect.UnionType):
        rest = [t for t in info.types if not isinstance(t, inspect.NoneType)]
        return rest[0] if len(rest) == 1 else info
    return info


def dump_config(cfg: AgentConfig) -> bytes:
    """YAML, as the operator writes it into the ConfigMap."""
    return msgspec.yaml.encode(cfg)
