"""Containers' CPU, memory and ephemeral-storage requests and limits (``resources.py``) and the
Kubernetes quantities they are written in (``quantity.py``)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_world import make_owner
from pdpair_operator import render, resources
from pdpair_operator.quantity import BadQuantity, cpu_cores, format_bytes, format_cores, parse
from pdpair_operator.spec import ROLES, generation_hash, parse_spec
from pdpair_operator.validate import invalid_reason

from dataplane.config import parse_config
from dataplane.schema.profiles import schema_from_config

ROOT = Path(__file__).resolve().parents[2]
MI = 1 << 20


@pytest.mark.parametrize(("text", "value"), [
    ("64Gi", 64 << 30), ("500M", 500 * 10**6), ("1e9", 10**9), ("1E3", 1000), ("1E", 10**18),
    ("1.5Ki", 1536), ("100m", Decimal("0.1")), ("250u", Decimal("0.00025")), ("+2", 2), ("-1", -1),
    (".5", Decimal("0.5")), ("2.", 2), ("7", 7)])
def test_quantities_parse_as_the_api_server_reads_them(text: str, value: Decimal | int) -> None:
    assert parse(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "12 GB", "1Gb", "1e3Ki", "1Mie3", "1e9999", "1..2", "0x10",
                                  "1" * 80])
def test_not_quantities(text: str) -> None:
    with pytest.raises(BadQuantity):
        parse(text)


def test_cpu_rounds_up_to_the_millicore_and_formats_back() -> None:
    assert cpu_cores("1500m") == Decimal("1.5") and cpu_cores("0.0001") == Decimal("0.001")
    cores = (format_cores(2), format_cores(Decimal("1.5")), format_cores(Decimal("0.25")))
    assert cores == ("2", "1500m", "250m")
    assert [format_bytes(n) for n in (0, 1, 1024, 3 * MI, 5 << 30, MI + 1)] == [
        "0", "1", "1Ki", "3Mi", "5Gi", "1048577"]
    with pytest.raises(BadQuantity):
        cpu_cores("-1")


def _res(**spec: Any) -> dict[str, dict[str, Any]]:
    owner = make_owner(**spec)
    pod = render.build_pod(owner, generation_hash(owner.spec), "decode", 0)
    return {c["name"]: c["resources"] for c in pod["spec"]["containers"]}


def _pools(profile: str, pages: int, requests: int, device: str = "cpu") -> int:
    """The pools' regions as the agent allocates them, each rounded up to 2 MiB."""
    cfg = resources.pool_config(parse_spec({"model": {"name": "m", "profile": profile, "poolPages": pages,
                                                      "maxRequests": requests}, "image": "i",
                                            "transfer": {"device": device}}), "decode")
    return sum(-(-r.size // (2 * MI)) * 2 * MI for r in schema_from_config(cfg).regions())


def test_agent_memory_is_its_base_plus_the_host_pools_of_its_rank() -> None:
    model = {"name": "m", "profile": "qwen3-next", "poolPages": 256, "maxRequests": 16}
    agent = _res(model=model)["agent"]
    assert _pools("qwen3-next", 256, 16) == 136 * MI
    assert agent["requests"]["memory"] == agent["limits"]["memory"] == "648Mi"  # 512 MiB + 136 MiB
    big = _res(model={**model, "poolPages": 4096})["agent"]["requests"]["memory"]
    assert big == format_bytes(512 * MI + _pools("qwen3-next", 4096, 16))


def test_one_agent_serves_every_rank_of_its_pod_so_it_holds_each_ranks_pools_and_threads() -> None:
    model = {"name": "m", "profile": "qwen3-next", "poolPages": 256, "maxRequests": 16}
    one = _res(model=model)["agent"]["requests"]
    two = _res(model=model, decode={"replicas": 1, "tensorParallelSize": 2})["agent"]["requests"]
    spec = parse_spec({"model": model, "image": "i", "decode": {"tensorParallelSize": 2}})
    per_rank = resources.host_pool_bytes(resources.pool_config(spec, "decode"))  # its share of the heads
    assert per_rank < _pools("qwen3-next", 256, 16)
    assert two["memory"] == format_bytes(512 * MI + 2 * per_rank)
    assert (one["cpu"], two["cpu"]) == ("2", "4")


def test_gpu_pools_take_no_host_memory_but_the_cuda_context_does() -> None:
    agent = _res(transfer={"device": "cuda"})["agent"]
    assert agent["requests"]["memory"] == "2560Mi"  # 512 MiB + 2 GiB, the pools are in GPU memory


@pytest.mark.parametrize(("transfer", "prefill", "decode"), [
    ({}, "2", "2"),  # prefill: worker + posting thread; decode: worker + UCX progress thread
    ({"device": "cuda"}, "2", "2"),  # no posting thread on the GPU; the progress thread on both
    ({"nixl": {"numThreads": 4}}, "5", "6"),  # NIXL's own threads instead of the posting thread
    ({"nixl": {"postThread": False, "progressThread": False}}, "1", "1"),
    ({"backend": "mori", "mori": {"numWorkerThreads": 3}}, "4", "4"),
])
def test_agent_cpu_counts_the_threads_that_run_busy(transfer: dict[str, Any], prefill: str,
                                                     decode: str) -> None:
    owner = make_owner(transfer={"backend": "nixl", **transfer})
    gen = generation_hash(owner.spec)
    got = {role: render.build_pod(owner, gen, role, 0)["spec"]["containers"][0]["resources"]
           for role in ROLES}
    assert (got["prefill"]["requests"]["cpu"], got["decode"]["requests"]["cpu"]) == (prefill, decode)
    assert got["prefill"]["limits"]["cpu"] == prefill


def test_the_spec_overrides_requests_and_limits() -> None:
    agent = _res(decode={"replicas": 1, "resources": {"gpus": 0, "cpu": "8", "memory": "64Gi",
                                                      "memoryLimit": "80Gi"}})
    assert agent["agent"]["requests"] == {"cpu": "8", "memory": "64Gi", "ephemeral-storage": "256Mi"}
    assert agent["agent"]["limits"] == {"cpu": "8", "memory": "80Gi", "ephemeral-storage": "1Gi"}
    capped = _res(decode={"replicas": 1, "resources": {"cpuLimit": "500m", "memoryLimit": "600Mi"}})["agent"]
    assert capped["requests"]["cpu"] == capped["limits"]["cpu"] == "500m", "a derived request stays within"
    assert capped["requests"]["memory"] == "600Mi"
    raised = _res(decode={"replicas": 1, "resources": {"cpuLimit": "16"}})["agent"]
    assert (raised["requests"]["cpu"], raised["limits"]["cpu"]) == ("2", "16")


def test_synthetic_sidecar_engine_holds_the_pools_unless_huge_pages_hold_them() -> None:
    model = {"name": "m", "profile": "qwen3-next", "poolPages": 256, "maxRequests": 16}
    plain = _res(model=model, engine={"mode": "sidecar"})
    assert plain["engine"]["requests"]["memory"] == "648Mi" and plain["engine"]["requests"]["cpu"] == "1"
    assert plain["agent"]["requests"]["memory"] == "648Mi", "decode's agent may touch the shared pages first"
    huge = _res(model=model, engine={"mode": "sidecar", "resources": {"hugePages": "136Mi", "cpu": "2"}})
    assert huge["engine"]["requests"] == {"cpu": "2", "memory": "512Mi", "hugepages-2Mi": "136Mi",
                                          "ephemeral-storage": "256Mi"}
    assert huge["agent"]["requests"]["memory"] == "512Mi"
    short = _res(model=model, engine={"mode": "sidecar", "resources": {"hugePages": "134Mi", "cpu": "2"}})
    assert short["engine"]["requests"]["memory"] == "648Mi", "pools that do not all fit stay in shared pages"


def test_a_named_engine_gets_only_what_the_spec_names() -> None:
    bare = _res(engine={"image": "sglang:1"}, transfer={"device": "cpu"})["engine"]
    assert "requests" not in bare and "cpu" not in bare.get("limits", {})
    named = _res(engine={"image": "sglang:1", "resources": {"cpu": "16", "memory": "200Gi",
                                                             "cpuLimit": "32"}})["engine"]
    assert named["requests"] == {"cpu": "16", "memory": "200Gi"}
    assert (named["limits"]["cpu"], named["limits"]["memory"]) == ("32", "200Gi")


@pytest.mark.parametrize(("extra", "reason", "words"), [
    ({"decode": {"replicas": 1, "resources": {"cpu": "lots"}}}, "BadQuantity",
     ["decode.resources.cpu", "'lots'", "500m"]),
    ({"prefill": {"replicas": 1, "resources": {"memoryLimit": "-1Gi"}}}, "BadQuantity",
     ["prefill.resources.memoryLimit", "64Gi"]),
    ({"prefill": {"replicas": 1, "resources": {"cpu": "4", "cpuLimit": "2"}}}, "LimitBelowRequest",
     ["prefill.resources.cpuLimit (2) is below prefill.resources.cpu (4)"]),
    ({"engine": {"mode": "sidecar", "resources": {"memory": "2Gi", "memoryLimit": "1Gi"}}},
     "LimitBelowRequest", ["engine.resources.memoryLimit (1Gi)"]),
    ({"engine": {"mode": "sidecar", "resources": {"cpu": "1", "hugePages": "2GB"}}}, "BadQuantity",
     ["engine.resources.hugePages", "'2GB'"]),
])
def test_quantities_the_crd_would_refuse_make_the_spec_invalid(extra: dict[str, Any], reason: str,
                                                                words: list[str]) -> None:
    owner = make_owner(**extra)
    found = invalid_reason(owner, generation_hash(owner.spec))
    assert found is not None and found[0] == reason
    assert all(w in found[1] for w in words), found


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_pool_config_sizes_the_pools_the_rendered_agent_config_allocates(path: Path) -> None:
    """``resources.pool_config`` repeats what of ``render.agent_config_for`` shapes the pools."""
    body = yaml.safe_load(path.read_text())
    owner = make_owner(**body["spec"])
    gen = generation_hash(owner.spec)
    for role in ROLES:
        rendered = parse_config(render.build_config_map(owner, gen)["data"][f"{role}.yaml"])
        ours = resources.pool_config(owner.spec, role)
        if owner.spec.layout_from_engine:  # the engine registers its pools; the agent adopts them
            assert (rendered.model.profile, rendered.model.components, rendered.model.kv_item_len) == (
                None, [], None)
            assert resources.agent_memory_bytes(owner.spec, role) < 4 << 30
            continue
        assert schema_from_config(ours) == schema_from_config(rendered)
        assert ours.transfer.nixl == rendered.transfer.nixl and ours.transfer.mori == rendered.transfer.mori
