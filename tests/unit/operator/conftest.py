"""Shared helpers for the operator's unit tests: sample bodies and observed objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CRD_PATH = REPO / "crds" / "chatfleet.io_chatbotservices.yaml"


@pytest.fixture(scope="session")
def crd() -> dict[str, Any]:
    """The CRD manifest."""
    return yaml.safe_load(CRD_PATH.read_text())


@pytest.fixture(scope="session")
def crd_schema(crd: dict[str, Any]) -> dict[str, Any]:
    """openAPIV3Schema of v1alpha1."""
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.fixture(autouse=True)
def collector_as_it_was():
    """The process's garbage collector as it was before each test: `main.configure` (the operator's
    start-up) sets its thresholds and adds a callback, for the operator's process, not pytest's."""
    import gc

    thresholds, callbacks = gc.get_threshold(), list(gc.callbacks)
    yield
    gc.set_threshold(*thresholds)
    gc.callbacks[:] = callbacks
