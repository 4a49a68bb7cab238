"""What the CRD cannot check about a spec, checked before any pod exists: the agents' own config and
schema check on the config the operator renders, the pools against the memory of the container that
holds them, and the CPU/memory quantities it names (``resources.problems``). A spec failing any gets
the ``InvalidSpec`` condition instead of pods that would only crash. Pure: the planner calls
``invalid_reason``.
"""

from __future__ import annotations

import msgspec

from dataplane.config import dump_config, parse_config
from dataplane.errors import BadInput
from dataplane.schema.profiles import schema_from_config

from . import render, resources
from .observe import Owner
from .quantity import BadQuantity, quantity_bytes
from .spec import ROLES, PDPairSpec, Role

__all__ = ["BadQuantity", "invalid_reason", "quantity_bytes"]


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB = {n} bytes"


def _pool_memory(spec: PDPairSpec, role: Role) -> tuple[str, list[str]]:
    """Which setting bounds the container holding the pools, and its quantities: the sidecar engine's
    memory and huge pages, or the agent's memory (in-process engine)."""
    if spec.engine.sidecar:
        res = spec.engine.resources
        return "engine.resources.memory + hugePages", [q for q in (res.memory, res.huge_pages) if q]
    return f"{role}.resources.memory", [q for q in (spec.role(role).resources.memory,) if q]


def _check_role(owner: Owner, generation: str, role: Role) -> tuple[str, str] | None:
    rendered = dump_config(render.agent_config_for(owner, generation, role))
    spec = owner.spec
    try:
        cfg = parse_config(rendered, source=f"the {role} agent's config")
        cfg.check_ranks()
        if spec.layout_from_engine:
            return None  # the engine's registration is checked by its agent, rank by rank
        schema = schema_from_config(cfg.attention_view())
    except BadInput as exc:
        return "AgentConfigRejected", f"{role}: {exc}"
    if spec.transfer.device != "cpu":
        return None  # pools in GPU memory: the spec names no GPU memory size to check against
    setting, quantities = _pool_memory(spec, role)
    if not quantities:
        return None
    try:
        limit = sum(quantity_bytes(q) for q in quantities)
    except BadQuantity as exc:
        return "BadQuantity", (
            f"{role}: {setting}: {str(exc)!r} is not a Kubernetes quantity (for example 64Gi)")
    pools = sum(region.size for region in schema.regions()) * cfg.tp_size  # every rank's, in the one pod
    if pools > limit:
        return "PoolsExceedMemory", (
            f"{role}: the transfer pools{_of_ranks(cfg.tp_size)} take {_gib(pools)} of host memory, "
            f"more than {setting} ({_gib(limit)}); raise it or lower model.poolPages / model.maxRequests "
            "/ model.layers")
    return None


def _of_ranks(n: int) -> str:
    return f" of its {n} ranks" if n > 1 else ""


_CHECKED: dict[bytes, tuple[str, str] | None] = {}
_CHECKED_MAX = 4096


def _check_engine(owner: Owner) -> tuple[str, str] | None:
    """An sglang engine needs its image, and writes its own command (the CRD says so at apply)."""
    engine = owner.spec.engine
    if engine.sglang is None:
        return None
    if not engine.image:
        return ("EngineImageMissing", "engine.sglang needs engine.image: an sglang image with PDPair's "
                "plugin (Dockerfile target sglang)")
    if engine.command or engine.args:
        return ("EngineCommandConflict", "engine.sglang writes the engine's command: put more sglang "
                "arguments in engine.sglang.args")
    return None


def invalid_reason(owner: Owner, generation: str) -> tuple[str, str] | None:
    """(reason, one-line message) for a spec no pod can serve, or None. Memoised on the spec: the
    planner asks on every pass."""
    key = msgspec.json.encode((owner.name, owner.namespace, generation, owner.spec))
    if key in _CHECKED:
        return _CHECKED[key]
    found = _check_engine(owner) or resources.problems(owner.spec)
    for role in ROLES:
        if found is not None:
            break
        found = _check_role(owner, generation, role)
    if len(_CHECKED) >= _CHECKED_MAX:
        _CHECKED.clear()
    _CHECKED[key] = found
    return found
