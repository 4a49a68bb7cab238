"""Simulated DRA inventory for the kwok GPU nodes: DeviceClasses and per-node ResourceSlices.

kwok nodes have no kubelet and no DRA driver, so nothing would publish their GPUs as DRA devices. These
objects stand in for what NVIDIA's k8s-dra-driver-gpu and AMD's k8s-gpu-dra-driver publish (driver
names, DeviceClass names and selectors, a subset of the device attributes), so the real kube-scheduler
allocates ResourceClaims to pods on kwok nodes. Like the nodes' ``nvidia.com/gpu`` capacity, it is
inventory only: no device exists and nothing prepares one (kwok marks the pods Running).

Each slice is owned by its Node, so the garbage collector removes it with the node, as it removes a
real driver's slices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RESOURCE_API = "resource.k8s.io/v1"
SIMULATED_LABEL = "pdpair.io/simulated"
"""On every object here: inventory of a simulated cluster, never a real driver's."""


@dataclass(frozen=True)
class Vendor:
    """One vendor's DRA driver, as the simulated slices present it."""

    driver: str
    device_type: str
    """The driver's ``type`` attribute of a whole GPU; its DeviceClass selects on it."""
    product: str
    memory: str
    architecture: str
    driver_version: str


NVIDIA = Vendor(driver="gpu.nvidia.com", device_type="gpu", product="NVIDIA H100 80GB HBM3",
                memory="80Gi", architecture="Hopper", driver_version="580.95.5")
AMD = Vendor(driver="gpu.amd.com", device_type="amdgpu", product="AMD Instinct MI300X",
             memory="192Gi", architecture="gfx942", driver_version="6.12.12")
VENDORS = (NVIDIA, AMD)


def device_class(vendor: Vendor) -> dict[str, Any]:
    """The DeviceClass the vendor's driver installs, named after the driver (whole GPUs only)."""
    expression = (f"device.driver == '{vendor.driver}' && "
                  f"device.attributes['{vendor.driver}'].type == '{vendor.device_type}'")
    return {
        "apiVersion": RESOURCE_API, "kind": "DeviceClass",
        "metadata": {"name": vendor.driver, "labels": {SIMULATED_LABEL: "true"}},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def _device(vendor: Vendor, node: str, index: int) -> dict[str, Any]:
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "type": {"string": vendor.device_type},
            "index": {"int": index},
            "uuid": {"string": f"GPU-kwok-{node}-{index}"},
            "productName": {"string": vendor.product},
            "architecture": {"string": vendor.architecture},
            "driverVersion": {"version": vendor.driver_version},
        },
        "capacity": {"memory": {"value": vendor.memory}},
    }


def resource_slice(vendor: Vendor, node: dict[str, Any], gpus: int) -> dict[str, Any]:
    """``gpus`` devices of ``vendor`` on ``node`` (a Node object, for its name and UID): one pool per
    node and driver, in one slice, as the drivers publish whole GPUs."""
    name = node["metadata"]["name"]
    return {
        "apiVersion": RESOURCE_API, "kind": "ResourceSlice",
        "metadata": {
            "name": f"{name}-{vendor.driver}",
            "labels": {SIMULATED_LABEL: "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                 "uid": node["metadata"]["uid"]}],
        },
        "spec": {
            "driver": vendor.driver,
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": [_device(vendor, name, i) for i in range(gpus)],
        },
    }


def inventory(nodes: list[dict[str, Any]], resources: dict[str, Vendor]) -> list[dict[str, Any]]:
    """DeviceClasses plus one slice per (node, vendor) whose extended GPU resource (a key of
    ``resources``, e.g. ``nvidia.com/gpu``) the node advertises: the same GPUs, seen through DRA."""
    objects = [device_class(v) for v in VENDORS]
    for node in nodes:
        capacity = (node.get("status") or {}).get("capacity") or {}
        for resource, vendor in resources.items():
            count = int(capacity.get(resource) or 0)
            if count > 0:
                objects.append(resource_slice(vendor, node, count))
    return objects


GPU_RESOURCES = {"nvidia.com/gpu": NVIDIA, "amd.com/gpu": AMD}
