"""Pure builders for the simulated GPU fleet: kwok Node manifests with NVIDIA GPU feature discovery labels."""

from __future__ import annotations

from dataclasses import dataclass

#: Label keys NVIDIA's GPU feature discovery sets on GPU nodes.
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_COUNT = "nvidia.com/gpu.count"
GPU_MEMORY = "nvidia.com/gpu.memory"
GPU_PRESENT = "nvidia.com/gpu.present"
GPU_RESOURCE = "nvidia.com/gpu"
#: Nodes of the simulated fleet carry this label (kwok manages them).
FLEET_LABEL = "chatfleet.io/simulated"


@dataclass(frozen=True)
class GPUProduct:
    """One GPU model as GPU feature discovery reports it."""

    product: str
    gpus: int
    memory_mib: int
    instance_type: str


H100 = GPUProduct("NVIDIA-H100-80GB-HBM3", 8, 81559, "p5.48xlarge")
A100 = GPUProduct("NVIDIA-A100-SXM4-80GB", 8, 81920, "p4de.24xlarge")
L4 = GPUProduct("NVIDIA-L4", 4, 23034, "g6.12xlarge")

#: The default mix, repeated for larger fleets: 4 nodes -> 2x H100, 1x A100, 1x L4.
DEFAULT_MIX: tuple[GPUProduct, ...] = (H100, H100, A100, L4)
ZONES = ("zone-a", "zone-b")


def gpu_node(name: str, gpu: GPUProduct, *, zone: str, taint: bool = False) -> dict:
    """A Node manifest with status (kept on create) that kwok will manage and mark Ready."""
    capacity = {
        "cpu": "96",
        "memory": "1Ti",
        "pods": "110",
        "ephemeral-storage": "1Ti",
        GPU_RESOURCE: str(gpu.gpus),
    }
    spec: dict = {}
    if taint:
        spec["taints"] = [{"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
            "labels": {
                "type": "kwok",
                FLEET_LABEL: "true",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": name,
                "node.kubernetes.io/instance-type": gpu.instance_type,
                "topology.kubernetes.io/zone": zone,
                GPU_PRESENT: "true",
                GPU_PRODUCT: gpu.product,
                GPU_COUNT: str(gpu.gpus),
                GPU_MEMORY: str(gpu.memory_mib),
            },
        },
        "spec": spec,
        "status": {
            "allocatable": dict(capacity),
            "capacity": dict(capacity),
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "kubeProxyVersion": "fake",
                "bootID": "",
                "containerRuntimeVersion": "",
                "kernelVersion": "",
                "machineID": "",
                "osImage": "",
                "systemUUID": "",
            },
            "phase": "Running",
        },
    }


def fleet(count: int, *, mix: tuple[GPUProduct, ...] = DEFAULT_MIX, taint: bool = False) -> list[dict]:
    """`count` GPU nodes named gpu-node-0.. cycling through `mix` and the zones.

    >>> [n["metadata"]["labels"][GPU_PRODUCT] for n in fleet(4)]
    ['NVIDIA-H100-80GB-HBM3', 'NVIDIA-H100-80GB-HBM3', 'NVIDIA-A100-SXM4-80GB', 'NVIDIA-L4']
    """
    if count < 1:
        raise ValueError(f"nodes: need at least 1 GPU node, got {count}")
    return [
        gpu_node(f"gpu-node-{i}", mix[i % len(mix)], zone=ZONES[i % len(ZONES)], taint=taint)
        for i in range(count)
    ]


def products(nodes: list[dict]) -> dict[str, int]:
    """GPU product label -> GPUs per node, for the given fleet."""
    return {n["metadata"]["labels"][GPU_PRODUCT]: int(n["status"]["capacity"][GPU_RESOURCE]) for n in nodes}
