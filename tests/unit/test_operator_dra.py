"""GPUs through Dynamic Resource Allocation: with ``resources.gpuAllocation: dra`` each pod claims its
GPUs from a per-generation ResourceClaimTemplate the PDPair owns, and every container of the pod (the
sidecar engine and the agent) names that one claim, so both see the same devices and the agent can
open the engine's CUDA IPC handles. Device-plugin GPUs go to one container only. Also the simulated
inventory (devcluster.dra) the kwok nodes publish, and unschedulable pods surfacing in the status."""

from __future__ import annotations

from typing import Any

import pytest
from operator_world import World, make_owner
from pdpair_operator import apply, naming, render
from pdpair_operator.observe import ChildView, pod_from_body
from pdpair_operator.planner import IMMUTABLE_KINDS, Plan
from pdpair_operator.spec import generation_hash

from devcluster import dra

DRA = {"gpuAllocation": "dra"}


def role_spec(resources: dict[str, Any], tp: int = 1, **extra: Any) -> dict[str, Any]:
    return {"replicas": 1, "tensorParallelSize": tp, "resources": resources, **extra}


def render_role(role: str = "decode", **spec: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    owner = make_owner(**spec)
    gen = generation_hash(owner.spec)
    return (render.build_pod(owner, gen, role, 0)["spec"],
            render.build_gpu_claim_template(owner, gen, role))


COMPUTE = {"cpu", "memory", "ephemeral-storage"}
"""Resources every container gets (tests/unit/test_operator_resources.py); here only devices matter."""


def containers(pod_spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each container's device resources: claims and device limits, CPU/memory/storage left out."""
    out: dict[str, dict[str, Any]] = {}
    for c in pod_spec["containers"]:
        res = c.get("resources", {})
        kept = {k: {r: q for r, q in v.items() if r not in COMPUTE} if k != "claims" else v
                for k, v in res.items()}
        out[c["name"]] = {k: v for k, v in kept.items() if v}
    return out


def test_sidecar_engine_and_agent_reference_the_same_claim() -> None:
    pod, template = render_role(engine={"mode": "sidecar"}, decode=role_spec({**DRA, "gpus": 2}))
    owner = make_owner(engine={"mode": "sidecar"}, decode=role_spec({**DRA, "gpus": 2}))
    gen = generation_hash(owner.spec)
    assert pod["resourceClaims"] == [{"name": "gpus",
                                      "resourceClaimTemplateName": f"demo-gpus-{gen}-decode"}]
    res = containers(pod)
    assert res["agent"] == res["engine"] == {"claims": [{"name": "gpus"}]}
    assert template is not None and template["metadata"]["name"] == f"demo-gpus-{gen}-decode"


def test_claim_template_asks_for_the_pods_gpu_count_from_the_vendor_class() -> None:
    _, template = render_role(engine={"mode": "sidecar"}, decode=role_spec(DRA, tp=4))
    assert template is not None
    assert (template["apiVersion"], template["kind"]) == ("resource.k8s.io/v1", "ResourceClaimTemplate")
    [request] = template["spec"]["spec"]["devices"]["requests"]
    assert request == {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                   "allocationMode": "ExactCount", "count": 4}}
    [ref] = template["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["uid"], ref["controller"]) == ("PDPair", "owner-uid", True)
    labels = template["metadata"]["labels"]
    assert labels[naming.LABEL_NAME] == "demo" and labels[naming.MANAGED_BY] == naming.MANAGER
    assert labels[naming.LABEL_ROLE] == "decode" and labels[naming.LABEL_GENERATION]
    claim_labels = template["spec"]["metadata"]["labels"]
    assert claim_labels[naming.LABEL_NAME] == "demo" and claim_labels[naming.LABEL_ROLE] == "decode"
    assert naming.MANAGED_BY not in claim_labels, "claims are the controller-manager's, not watched children"


@pytest.mark.parametrize(("resources", "device_class"), [
    ({"gpuResourceName": "amd.com/gpu"}, "gpu.amd.com"),
    ({"gpuResourceName": "nvidia.com/mig-1g.10gb"}, "gpu.nvidia.com"),
    ({"gpuDeviceClassName": "h200.gpu.example.com"}, "h200.gpu.example.com"),
])
def test_device_class_defaults_by_vendor_or_is_named(resources: dict[str, Any], device_class: str) -> None:
    _, template = render_role(decode=role_spec({**DRA, **resources}))
    assert template is not None
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == device_class


def test_in_process_agent_alone_names_the_claim() -> None:
    pod, template = render_role(prefill=role_spec({**DRA, "rdma": {"resourceName": "rdma/x", "count": 1}}),
                                role="prefill")
    assert containers(pod) == {"agent": {"claims": [{"name": "gpus"}], "limits": {"rdma/x": "1"}}}
    assert template is not None and pod["resourceClaims"][0]["name"] == "gpus"


def test_dra_without_gpus_claims_nothing() -> None:
    pod, template = render_role(engine={"mode": "sidecar"}, decode=role_spec({**DRA, "gpus": 0}))
    assert template is None and "resourceClaims" not in pod
    assert containers(pod) == {"agent": {}, "engine": {}}


def test_device_plugin_gpus_go_to_one_container_the_sidecar_engine_if_any() -> None:
    plain, _ = render_role(decode=role_spec({"gpus": 2}))
    assert containers(plain) == {"agent": {"limits": {"nvidia.com/gpu": "2"}}}
    sidecar, template = render_role(engine={"image": "sglang:1"}, transfer={"device": "cpu"},
                                    decode=role_spec({"gpus": 2, "cpu": "4"}))
    res = containers(sidecar)
    assert res["engine"] == {"limits": {"nvidia.com/gpu": "2"}}
    assert res["agent"] == {}, "the agent gets no device-plugin GPU"
    assert sidecar["containers"][0]["resources"]["requests"]["cpu"] == "4"
    assert template is None and "resourceClaims" not in sidecar


def test_gpu_allocation_is_part_of_the_generation() -> None:
    plugin, claimed = make_owner(), make_owner(decode=role_spec(DRA))
    assert generation_hash(plugin.spec) != generation_hash(claimed.spec)


def test_planner_creates_templates_and_deletes_them_with_their_generation() -> None:
    world = World(make_owner(engine={"mode": "sidecar"}, prefill=role_spec(DRA), decode=role_spec(DRA)))
    old = generation_hash(world.owner.spec)
    created = world.step().creates
    templates = sorted(m["metadata"]["name"] for m in created if m["kind"] == "ResourceClaimTemplate")
    assert templates == [f"demo-gpus-{old}-decode", f"demo-gpus-{old}-prefill"]
    world.run()
    world.step()
    world.spec_change(engine={"mode": "sidecar"}, prefill=role_spec({**DRA, "gpus": 2}),
                      decode=role_spec(DRA))
    new = generation_hash(world.owner.spec)
    for _ in range(8):
        world.step()
        world.run()
    kinds = {name for kind, name in world.children if kind == "ResourceClaimTemplate"}
    assert kinds == {f"demo-gpus-{new}-decode", f"demo-gpus-{new}-prefill"}
    counts = world.manifests[("ResourceClaimTemplate", f"demo-gpus-{new}-prefill")]["spec"]["spec"]
    assert counts["devices"]["requests"][0]["exactly"]["count"] == 2


def test_claim_templates_are_never_patched() -> None:
    """Their spec is immutable in the API server; a changed one is a new generation, hence a new name."""
    world = World(make_owner(decode=role_spec(DRA)))
    world.step()
    gen = generation_hash(world.owner.spec)
    key = ("ResourceClaimTemplate", f"demo-gpus-{gen}-decode")
    world.children[key] = ChildView(*key, generation=gen, render_hash="stale")
    result = world.step()
    assert "ResourceClaimTemplate" in IMMUTABLE_KINDS
    assert [p for p in result.patches if p.kind == "ResourceClaimTemplate"] == []
    assert key not in {(m["kind"], m["metadata"]["name"]) for m in result.creates}


def test_executor_path_of_claim_templates() -> None:
    assert apply.object_path("ns", "ResourceClaimTemplate", "t") == \
        "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaimtemplates/t"
    assert apply.object_path("ns", "Pod") == "/api/v1/namespaces/ns/pods"


def test_unschedulable_pod_is_the_ready_reason() -> None:
    world = World(make_owner(decode=role_spec({**DRA, "gpuDeviceClassName": "gpu.example.com"})))
    world.step()
    gen = generation_hash(world.owner.spec)
    name = f"demo-{gen}-decode-0"
    message = "0/7 nodes are available: request gpus: device class gpu.example.com does not exist."
    body = {**world.manifests[("Pod", name)], "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}}
    world.pods[name] = pod_from_body(body)
    status = world.step().status
    assert status is not None
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "PodsUnschedulable"
    assert ready["message"].endswith(f"{name}: Unschedulable: {message}")


def test_simulated_inventory_mirrors_each_nodes_gpu_capacity() -> None:
    nodes = [{"metadata": {"name": "n0", "uid": "u0"}, "status": {"capacity": {"nvidia.com/gpu": "8"}}},
             {"metadata": {"name": "a0", "uid": "u1"}, "status": {"capacity": {"amd.com/gpu": "4"}}},
             {"metadata": {"name": "cpu", "uid": "u2"}, "status": {"capacity": {"cpu": "8"}}}]
    objects = dra.inventory(nodes, dra.GPU_RESOURCES)
    classes = {o["metadata"]["name"]: o for o in objects if o["kind"] == "DeviceClass"}
    assert set(classes) == {"gpu.nvidia.com", "gpu.amd.com"}
    assert "device.attributes['gpu.amd.com'].type == 'amdgpu'" in \
        classes["gpu.amd.com"]["spec"]["selectors"][0]["cel"]["expression"]
    slices = {o["spec"]["nodeName"]: o for o in objects if o["kind"] == "ResourceSlice"}
    assert set(slices) == {"n0", "a0"}
    assert slices["n0"]["spec"]["driver"] == "gpu.nvidia.com" and len(slices["n0"]["spec"]["devices"]) == 8
    assert slices["a0"]["spec"]["driver"] == "gpu.amd.com" and len(slices["a0"]["spec"]["devices"]) == 4
    assert slices["a0"]["metadata"]["ownerReferences"][0] == {
        "apiVersion": "v1", "kind": "Node", "name": "a0", "uid": "u1"}
    assert all(o["metadata"]["labels"][dra.SIMULATED_LABEL] == "true" for o in objects)


class _NoDraApiServer:
    """Answers like an API server without resource.k8s.io/v1: the path itself is not served."""

    def request(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        if path.startswith("/apis/resource.k8s.io/"):
            raise apply.KubeError(404, "404 page not found")
        return {}


def test_claim_template_on_an_api_server_without_dra_is_a_specific_error() -> None:
    import asyncio

    owner = make_owner(decode=role_spec(DRA))
    gen = generation_hash(owner.spec)
    template = render.build_gpu_claim_template(owner, gen, "decode")
    assert template is not None
    executor = apply.Executor(_NoDraApiServer(), concurrency=2)  # type: ignore[arg-type]
    errors = asyncio.run(executor.apply(owner, Plan(creates=(template,)), "2026-01-01T00:00:00Z"))
    [error] = errors
    assert error.target == f"ResourceClaimTemplate/demo-gpus-{gen}-decode"
    assert "does not serve resource.k8s.io/v1 ResourceClaimTemplates" in error.message
    assert "Kubernetes 1.34 or later" in error.message
