"""The unit layer runs on two pytest-xdist workers (hack/test-layers.sh): its long tests go first, so
that the other worker works through the short ones beside them instead of waiting for them at the end."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `slow` first (a stable sort: the others keep their order)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
