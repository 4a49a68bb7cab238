"""Kubernetes resource quantities (``64Gi``, ``500m``, ``1e9``), parsed and written as the API server
does: the operator derives requests from byte counts and checks sizes named in a spec against them.

The grammar is Kubernetes' own (``k8s.io/apimachinery/pkg/api/resource``): a signed decimal number
followed by one binary suffix (``Ki`` .. ``Ei``), one decimal suffix (``n``, ``u``, ``m``, none, ``k`` ..
``E``) or a decimal exponent (``e3``, ``E-2``), never two of them. Pure, standard library only.
"""

from __future__ import annotations

import re
from decimal import Decimal

__all__ = ["BadQuantity", "cpu_cores", "format_bytes", "format_cores", "parse", "quantity_bytes"]

_SCALE: dict[str, Decimal] = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(
    r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE]([+-]?[0-9]{1,3}))?")
_MAX_LENGTH = 64
KI, MI, GI = 1 << 10, 1 << 20, 1 << 30


class BadQuantity(ValueError):
    """Not a Kubernetes quantity, or one that cannot size what it names (negative bytes)."""


def parse(text: str) -> Decimal:
    """The exact value of a quantity (``1.5Gi`` -> 1610612736, ``250m`` -> 0.25)."""
    if len(text) > _MAX_LENGTH:
        raise BadQuantity(text[:_MAX_LENGTH] + "...")
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise BadQuantity(text)
    number, suffix, exponent = match.groups()
    scale = Decimal(10) ** int(exponent) if exponent is not None else _SCALE[suffix or ""]
    return Decimal(number) * scale


def quantity_bytes(text: str) -> int:
    """A size in bytes, rounded up to a whole byte as the API server does (``64Gi``, ``500M``)."""
    value = parse(text)
    if value < 0:
        raise BadQuantity(text)
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def cpu_cores(text: str) -> Decimal:
    """CPU cores, to the millicore the API server keeps (``500m`` -> 0.5, ``2`` -> 2)."""
    value = parse(text)
    if value < 0:
        raise BadQuantity(text)
    return (value * 1000).to_integral_value(rounding="ROUND_CEILING") / 1000


def format_bytes(n: int) -> str:
    """``n`` bytes as the API server would print them: the largest binary suffix that divides it."""
    if n < 0:
        raise ValueError(f"negative size {n}")
    for suffix, unit in (("Gi", GI), ("Mi", MI), ("Ki", KI)):
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def format_cores(cores: Decimal | int) -> str:
    """Whole cores as an integer (``2``), others in millicores (``1500m``)."""
    milli = int((Decimal(cores) * 1000).to_integral_value(rounding="ROUND_CEILING"))
    if milli < 0:
        raise ValueError(f"negative CPU {cores}")
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"
