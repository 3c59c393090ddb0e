"""Admission corpus fixtures: the CRD installed once per session on the local platform."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def crd_installed(chatfleet_crd):
    """The cluster with the ChatbotService CRD served (tests/conftest.py)."""
    return chatfleet_crd
