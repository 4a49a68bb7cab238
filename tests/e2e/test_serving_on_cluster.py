"""A serving PDPair on the real control plane: every example with an sglang engine is accepted by the API
server (the PDPair by the CRD's schema and CEL rules, its rendered pods and router by server-side dry
run), and the operator's router fronts exactly the pair's pods: its Service reaches the router's pods, and
the router's Kubernetes discovery (its own argument parser reads the live Deployment) selects the
current generation's prefill and decode pods, with the prefill bootstrap port where the router reads it.

kwok runs no containers, so neither sglang nor the router runs here; what each would do with these
objects is what the API server holds."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_support import get, pdpair, pdpair_yaml, pods
from pdpair_operator import render, serving
from pdpair_operator.observe import owner_from_body
from pdpair_operator.spec import generation_hash

from dataplane.harness.waiting import wait_for
from devcluster import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
SGLANG_IMAGE = "ghcr.io/pdpair/sglang:0.1.0"


def with_sglang(doc: dict[str, Any]) -> dict[str, Any]:
    """The example with sglang as its engine. GPU state needs the agent to open the engine's CUDA IPC
    handles, so a cuda example claims its GPUs through DRA (the CRD refuses the device plugin there)."""
    doc = copy.deepcopy(doc)
    spec = doc["spec"]
    spec["engine"] = {"image": SGLANG_IMAGE, "sglang": {"modelPath": spec["model"]["name"]}}
    if spec.get("transfer", {}).get("device") == "cuda":
        for role in ("prefill", "decode"):
            spec.setdefault(role, {}).setdefault("resources", {})["gpuAllocation"] = "dra"
    return doc


def as_list(objects: list[dict[str, Any]]) -> str:
    """JSON, not YAML: PyYAML leaves a render hash like ``123e4567`` unquoted, and kubectl's YAML 1.2
    reads it as a number."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})


def dry_run(cluster: Cluster, ns: str, objects: list[dict[str, Any]]) -> str:
    text = as_list(objects)
    proc = cluster.kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-", input=text, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_with_sglang_passes_server_side_dry_run(cluster: Cluster, ns: str,
                                                              example: Path) -> None:
    doc = with_sglang(yaml.safe_load(example.read_text()))
    doc["metadata"].pop("namespace", None)
    out = dry_run(cluster, ns, [doc])
    assert "(server dry run)" in out
    owner = owner_from_body({**doc, "metadata": {**doc["metadata"], "namespace": ns, "uid": "u-1"}})
    gen = generation_hash(owner.spec)
    # The agents' ServiceAccount must exist for the pods' admission (the operator makes it first).
    identity = [dict(o) for o in render.build_agent_identity(owner, "pdpair-agent")]
    for obj in identity:
        obj["metadata"] = {k: v for k, v in obj["metadata"].items() if k != "ownerReferences"}
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=as_list(identity))
    objects = [render.build_pod(owner, gen, role, 0) for role in ("prefill", "decode")]
    objects += render.build_router_children(owner, gen, network_policy=True)
    for obj in objects:
        obj["metadata"].pop("ownerReferences")  # the owner is not stored: a dry run
    out = dry_run(cluster, ns, objects)
    assert out.count("(server dry run)") == len(objects), out
    engines = [c for o in objects if o["kind"] == "Pod"
               for c in o["spec"]["containers"] if c["name"] == "engine"]
    assert all("pdpair" in e["args"] for e in engines)


def router_args(deployment: dict[str, Any]) -> Any:
    from sglang_router.router_args import RouterArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return RouterArgs.from_cli_args(parser.parse_args(container["args"]), use_router_prefix=False)


def selected(cluster: Cluster, ns: str, selector: dict[str, str]) -> set[str]:
    label = ",".join(f"{k}={v}" for k, v in selector.items())
    return {p["metadata"]["name"] for p in get(cluster, "pods", ns, "-l", label)["items"]}


def test_router_service_fronts_the_router_and_the_router_finds_the_pairs_pods(
        cluster: Cluster, ns: str) -> None:
    engine = {"image": SGLANG_IMAGE, "sglang": {"modelPath": "meta-llama/Llama-3.1-8B-Instruct"}}
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=pdpair_yaml("serve", 1, 2, engine=engine))
    status = wait_for("status.router", lambda: pdpair(cluster, ns, "serve").get("status", {}).get("router"))
    assert status == f"http://serve-router.{ns}.svc:8000"
    deployment = wait_for("the router Deployment", lambda: get(cluster, "deployments", ns, "-l",
                                                               "pdpair.io/name=serve")["items"])[0]
    parsed = router_args(deployment)
    assert parsed.pd_disaggregation and parsed.service_discovery
    assert parsed.service_discovery_namespace == ns

    def engines() -> tuple[set[str], set[str]] | None:
        live = [p for p in pods(cluster, ns, "serve") if not p["metadata"].get("deletionTimestamp")]
        by_role = ({p["metadata"]["name"] for p in live if p["metadata"]["labels"]["pdpair.io/role"] == r}
                   for r in ("prefill", "decode"))
        prefill, decode = by_role
        return (prefill, decode) if (len(prefill), len(decode)) == (1, 2) else None

    prefill, decode = wait_for("1 prefill and 2 decode pods", engines, timeout=90)
    assert selected(cluster, ns, parsed.prefill_selector) == prefill
    assert selected(cluster, ns, parsed.decode_selector) == decode
    for name in prefill:
        pod = get(cluster, "pod", ns, name)
        assert pod["metadata"]["annotations"][parsed.bootstrap_port_annotation] == "8998"
    # The Service reaches the router's pods (the controller-manager made them from the Deployment;
    # kwok marks them ready), and the router's account may read the pods it discovers.
    svc = get(cluster, "service", ns, "serve-router")
    assert svc["spec"]["selector"] == serving.router_labels("serve")

    def endpoints() -> set[str] | None:
        slices = get(cluster, "endpointslices", ns, "-l", "kubernetes.io/service-name=serve-router")["items"]
        refs = {e["targetRef"]["name"] for s in slices for e in s.get("endpoints") or []
                if e.get("conditions", {}).get("ready")}
        return refs or None

    routers = wait_for("the router Service's ready endpoints", endpoints, timeout=90)
    assert routers == selected(cluster, ns, serving.router_labels("serve"))
    can = cluster.kubectl("auth", "can-i", "watch", "pods", "-n", ns,
                          f"--as=system:serviceaccount:{ns}:serve-router", check=False)
    assert can.stdout.strip() == "yes"
    cannot = cluster.kubectl("auth", "can-i", "get", "secrets", "-n", ns,
                             f"--as=system:serviceaccount:{ns}:serve-router", check=False)
    assert cannot.stdout.strip() == "no"
    # A new generation moves the router's selectors with it.
    cluster.kubectl("patch", "pdpair", "serve", "-n", ns, "--type=merge",
                    "-p", '{"spec": {"image": "ghcr.io/pdpair/agent:0.1.1"}}')
    gen2 = generation_hash(owner_from_body(pdpair(cluster, ns, "serve")).spec)

    def moved() -> bool:
        items = get(cluster, "deployments", ns, "-l", "pdpair.io/name=serve")["items"]
        return bool(items) and router_args(items[0]).prefill_selector.get("pdpair.io/generation") == gen2

    wait_for("the router to follow the new generation", moved, timeout=60)


def test_a_spec_without_layout_needs_an_engine_that_registers_one(cluster: Cluster, ns: str) -> None:
    """No profile and no components: only an engine image that registers its pools gives the layout."""
    doc = yaml.safe_load(pdpair_yaml("nolayout", 1, 1))
    doc["spec"]["model"] = {"name": "Qwen/Qwen3-Next-80B-A3B-Instruct"}
    text = yaml.safe_dump(doc)
    refused = cluster.kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-", input=text, check=False)
    assert refused.returncode != 0
    assert "or neither to take the layout the engine registers" in refused.stderr
    doc["spec"]["engine"] = {"image": SGLANG_IMAGE, "sglang": {"modelPath": "Qwen/Qwen3-Next"}}
    dry_run(cluster, ns, [doc])
    two = copy.deepcopy(doc)
    two["spec"]["prefill"]["replicas"] = 2
    dry_run(cluster, ns, [two])  # several prefill pods serve: decode pairs with the one the router names
    both = copy.deepcopy(doc)
    both["spec"]["model"]["profile"] = "qwen3-next"
    both["spec"]["model"]["components"] = [
        {"name": "mamba", "stateType": "mamba", "itemLens": [64], "numItems": 8}]
    refused = cluster.kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-",
                              input=yaml.safe_dump(both), check=False)
    assert refused.returncode != 0
    assert "set exactly one of model.profile or model.components" in refused.stderr
