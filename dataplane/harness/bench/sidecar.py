"""``sidecar-bench``: the agent benchmark rerun through the local API. Per case and in one run: the agent
with its in-process synthetic source (``direct``), and per role a sidecar agent plus a synthetic engine
process (``sidecar``, and ``presend``: the prefill engine sends each room before decode asks), with the
same requests and rooms in flight; ``pdpair-agent sidecar-bench --help`` says what each column means."""

from __future__ import annotations

import math
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ..agent_processes import CpuProbe, run_pair
from ..sidecar_pair import SidecarPair


def with_warmup(cfg: Any, warmup: int) -> Any:
    """``warmup`` more requests, left out of both setups' figures: the sidecar engine's first requests
    wait for the agents to pair, which the in-process engine never counts (it starts once paired)."""
    syn = cfg.synthetic
    return msgspec.structs.replace(
        cfg, synthetic=msgspec.structs.replace(syn, requests=syn.requests + warmup, warmup=warmup)
    )


def direct_run(cfg: Any) -> dict[str, Any]:
    """The agent with its in-process engine: decode's bytes over its transfer window."""
    st = run_pair(cfg, prefix="pdpair-sidecar-bench-direct-")
    total = sum(c["bytes"] for c in st["components"].values())
    window = st["transfer_window_seconds"]
    n = max(1, st["requests"]["succeeded"] - cfg.synthetic.warmup)
    return {
        "bytes": total, "gbps": total / window / 1e9 if window else 0.0, "us": window / n * 1e6,
        **per_request_cpu(st["prefill_cpu"], cfg.synthetic.requests),
    }


def per_request_cpu(spent: dict[str, float | None], rooms: int) -> dict[str, float]:
    """The prefill agent's CPU µs per room (warm-up rooms included in both the CPU and the count):
    its whole process, and its role-worker thread (NaN where ``/proc`` has no figure)."""
    return {
        f"prefill_{key}_us": (spent[f"{key}_seconds"] or math.nan) / max(1, rooms) * 1e6
        for key in ("process", "worker")
    }


@dataclass(frozen=True)
class Sidecar:
    """How the sidecar setup runs: the engines' pools, their idle polling, the agents' reply spin."""

    huge_pages: str = "auto"
    engine_poll_us: int = 1000
    reply_spin_us: int | None = None
    """None: the config's ``localapi.engine.replySpinMicroseconds``."""


def run_case(label: str, cfg: Any, repeat: int = 1, setup: Sidecar = Sidecar()) -> dict[str, Any]:
    runs = [
        (direct_run(cfg), sidecar_run(cfg, False, setup), sidecar_run(cfg, True, setup))
        for _ in range(repeat)
    ]
    med, spin = statistics.median, setup.reply_spin_us
    direct, side, ahead = ({k: med(r[i][k] for r in runs) for k in runs[0][i]} for i in range(3))
    huge = all(r[i]["huge_pages"] for r in runs for i in (1, 2))
    return {
        "case": label,
        "requests": cfg.synthetic.requests - cfg.synthetic.warmup,
        "warmup": cfg.synthetic.warmup,
        "inflight": cfg.synthetic.max_inflight,
        "bytes": side["bytes"],
        "direct_gbps": round(direct["gbps"], 4),
        "sidecar_gbps": round(side["gbps"], 4),
        "ratio": round(side["gbps"] / direct["gbps"], 4) if direct["gbps"] else None,
        "direct_us_per_request": round(direct["us"], 1),
        "sidecar_us_per_request": round(side["us"], 1),
        "interface_us": round(side["us"] - direct["us"], 1),
        "api_us": side["api_us"],
        "sidecar_huge_pages": huge,
        "engine_poll_us": setup.engine_poll_us,
        "reply_spin_us": cfg.localapi.engine.reply_spin_microseconds if spin is None else spin,
        "presend_gbps": round(ahead["gbps"], 4),
        "presend_ratio": round(ahead["gbps"] / direct["gbps"], 4) if direct["gbps"] else None,
        "presend_interface_us": round(ahead["us"] - direct["us"], 1),
        "ratio_runs": [round(s["gbps"] / d["gbps"], 3) if d["gbps"] else None for d, s, _ in runs],
        "presend_ratio_runs": [round(a["gbps"] / d["gbps"], 3) if d["gbps"] else None for d, _, a in runs],
        **{
            f"{setup}_prefill_{key}_us": _rounded(figures[f"prefill_{key}_us"])
            for setup, figures in (("direct", direct), ("sidecar", side), ("presend", ahead))
            for key in ("process", "worker")
        },
    }


def _cpu_pair(r: dict[str, Any]) -> str:
    """The prefill agent's CPU per request, direct / sidecar ("-" where /proc gave none)."""
    d, s = r["direct_prefill_process_us"], r["sidecar_prefill_process_us"]
    return f"{d:.0f}/{s:.0f}" if d is not None and s is not None else "-"


def _rounded(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 1)


def sidecar_run(cfg: Any, presend: bool, side: Sidecar = Sidecar()) -> dict[str, Any]:
    syn = cfg.synthetic
    if side.reply_spin_us is not None:
        cfg = cfg.with_engine(reply_spin_microseconds=side.reply_spin_us)
    common = ["--requests", str(syn.requests), "--no-verify", "--room-base", str(1 << 40),
              "--tokens", ",".join(str(t) for t in syn.tokens)]
    inflight = syn.max_inflight
    engine = ["--huge-pages", side.huge_pages, "--poll-us", str(side.engine_poll_us)]
    prefill = [*common, "--presend", str(inflight + 1), *engine] if presend else engine
    decode_args = [*common, "--inflight", str(inflight), *engine]
    with tempfile.TemporaryDirectory(prefix="pdpair-sidecar-bench-") as tmp, \
            SidecarPair(cfg, Path(tmp), decode_args=decode_args, prefill_args=prefill) as pair:
        cpu = CpuProbe(pair.agents["prefill"])
        decode = pair.engines["decode"]
        decode.wait(600)
        rep = decode.report()
        huge = rep.get("huge_pages", False) and pair.engines["prefill"].report().get("huge_pages", False)
        spent = cpu.spent()
    n = max(1, int(rep["counts"].get("measured", 0)))
    window = float(rep["window_seconds"])
    return {
        "bytes": rep["bytes"],
        "gbps": rep["bytes"] / window / 1e9 if window else 0.0,
        "us": window / n * 1e6,
        "api_us": rep["api_us_per_call"],
        "huge_pages": bool(huge),
        **per_request_cpu(spent, syn.requests),
    }


def table(results: list[dict[str, Any]]) -> str:
    cols = [
        ("case", "case", 16, ""), ("requests", "requests", 8, ""), ("direct GB/s", "direct_gbps", 11, ".3f"),
        ("sidecar GB/s", "sidecar_gbps", 12, ".3f"), ("ratio", "ratio", 6, ".3f"),
        ("presend GB/s", "presend_gbps", 12, ".3f"), ("ratio", "presend_ratio", 6, ".3f"),
        ("direct us/req", "direct_us_per_request", 13, ".1f"), ("interface us", "interface_us", 12, ".1f"),
        ("presend us", "presend_interface_us", 10, ".1f"), ("api us", "api_us", 7, ".1f"),
        ("prefill CPU us d/s", "prefill_cpu", 18, ""), ("huge", "sidecar_huge_pages", 5, ""),
    ]
    head = " ".join(f"{title:>{w}}" if i else f"{title:<{w}}" for i, (title, _, w, _) in enumerate(cols))
    lines = [head, "-" * len(head)]
    for r in results:
        cells = []
        for i, (_, key, w, fmt) in enumerate(cols):
            value: Any
            if key == "prefill_cpu":
                value = _cpu_pair(r)
            elif key == "sidecar_huge_pages":
                value = "yes" if r[key] else "no"
            else:
                value = r[key] if r[key] is not None else 0
            cells.append(f"{value:{'<' if not i else '>'}{w}{fmt}}")
        lines.append(" ".join(cells))
    return "\n".join(lines)
