"""What the CRD cannot check about a spec, checked before any pod exists: the agents' own config and
schema check on the config the operator renders, and the pools against the memory of the container
that holds them. A spec failing either gets the ``InvalidSpec`` condition instead of pods that would
only crash. Pure: the planner calls ``invalid_reason``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

import msgspec

from dataplane.config import dump_config, parse_config
from dataplane.errors import BadInput
from dataplane.schema.profiles import schema_from_config

from . import render
from .observe import Owner
from .spec import ROLES, PDPairSpec, Role

_SUFFIX: dict[str, int | Decimal] = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "m": Decimal("0.001")}
_QUANTITY = re.compile(
    r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]{1,3}))?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")


class BadQuantity(ValueError):
    pass


def quantity_bytes(text: str) -> int:
    """A Kubernetes quantity (``64Gi``, ``500M``, ``1e9``) in bytes, rounded up."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise BadQuantity(text)
    number, exponent, suffix = match.groups()
    try:
        value = Decimal(number) * Decimal(10) ** int(exponent or 0) * _SUFFIX[suffix or ""]
    except InvalidOperation:
        raise BadQuantity(text) from None
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


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
    try:
        cfg = parse_config(rendered, source=f"the {role} agent's config")
        cfg.check_ranks()
        schema = schema_from_config(cfg.attention_view())
    except BadInput as exc:
        return "AgentConfigRejected", f"{role}: {exc}"
    spec = owner.spec
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
            f"more than {setting} ({_gib(limit)}); raise it or lower model.poolPages / model.maxRequests")
    return None


def _of_ranks(n: int) -> str:
    return f" of its {n} ranks" if n > 1 else ""


_CHECKED: dict[bytes, tuple[str, str] | None] = {}
_CHECKED_MAX = 4096


def invalid_reason(owner: Owner, generation: str) -> tuple[str, str] | None:
    """(reason, one-line message) for a spec no pod can serve, or None. Memoised on the spec: the
    planner asks on every pass."""
    key = msgspec.json.encode((owner.name, owner.namespace, generation, owner.spec))
    if key in _CHECKED:
        return _CHECKED[key]
    found = None
    for role in ROLES:
        found = _check_role(owner, generation, role)
        if found is not None:
            break
    if len(_CHECKED) >= _CHECKED_MAX:
        _CHECKED.clear()
    _CHECKED[key] = found
    return found
