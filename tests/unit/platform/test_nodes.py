"""The simulated GPU fleet's node manifests."""

import pytest
from chatfleet_platform.cluster import nodes

pytestmark = pytest.mark.harness  # the simulated platform, not the product


class TestFleet:
    def test_default_mix_has_two_products_and_gpu_capacity(self):
        fleet = nodes.fleet(4)
        products = [n["metadata"]["labels"][nodes.GPU_PRODUCT] for n in fleet]
        assert len(set(products)) >= 2
        for n in fleet:
            labels = n["metadata"]["labels"]
            assert labels[nodes.GPU_PRESENT] == "true"
            assert n["status"]["capacity"][nodes.GPU_RESOURCE] == labels[nodes.GPU_COUNT]
            assert int(labels[nodes.GPU_MEMORY]) > 0

    @pytest.mark.parametrize("count", [1, 4, 250], ids=["one", "default", "bench"])
    def test_names_are_unique(self, count):
        names = [n["metadata"]["name"] for n in nodes.fleet(count)]
        assert len(set(names)) == count

    def test_taint_is_optional(self):
        assert "taints" not in nodes.fleet(1)[0]["spec"]
        assert nodes.fleet(1, taint=True)[0]["spec"]["taints"][0]["key"] == "nvidia.com/gpu"

    def test_zero_nodes_is_refused_with_the_field(self):
        with pytest.raises(ValueError, match="nodes"):
            nodes.fleet(0)

    def test_products_summary(self):
        assert nodes.products(nodes.fleet(4)) == {
            "NVIDIA-H100-80GB-HBM3": 8,
            "NVIDIA-A100-SXM4-80GB": 8,
            "NVIDIA-L4": 4,
        }
