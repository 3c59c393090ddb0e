"""Operator integration fixtures: the CRD, one operator process per session (restartable), helpers.

The operator runs as `python -m chatfleet_operator.cli run` in a subprocess against the session's local
cluster, logs to a file, and is stopped by its PID (SIGTERM, or SIGKILL for the restart test).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from operator_it import Kube
from operator_process import OperatorProcess

#: What the suite's operator watches: everything but the namespaces another operator owns. It lives for
#: the whole pytest session, so it must leave alone the e2e suite's namespaces, the solo-* ones (a test
#: drives a Controller in-process), keda-* (the KEDA test's own operator), real-* (the real-pod suite's
#: operator, with its real-node settings) and cfwatch-* (the operator the chart installs in a pod). Two
#: operators on one ChatbotService write its Deployment in turns: a real-* release's stable Deployment
#: reached generation 3,105 in 8 minutes, its chat API's CPU flipping between the two operators' 300m
#: and 500m, and the zero-drop tests failed.
SUITE_SCOPE = ("!e2e-*,!solo-*,!keda-*,!real-*,!cfwatch-*",)
#: The suite's operator writes HPAs whether or not the session has started KEDA (the `keda` fixture):
#: its tests are about the HPA path; test_operator_keda.py runs an operator on auto-discovery.
SUITE_ARGS = ("--autoscaler=hpa",)


@pytest.fixture(scope="session")
def operator(chatfleet_crd, tmp_path_factory) -> Iterator[OperatorProcess]:
    """One operator process for the session, serving its /metrics on a loopback port (tests may restart it)."""
    op = OperatorProcess(
        chatfleet_crd, tmp_path_factory.mktemp("operator"), SUITE_SCOPE, SUITE_ARGS, serve_metrics=True
    )
    op.start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture
def kube(operator, namespace) -> Kube:
    """kubectl helpers in a fresh namespace, with the operator running."""
    return Kube(operator.cluster, namespace, operator)


@pytest.fixture
def solo_namespace(chatfleet_crd) -> Iterator[str]:
    """A fresh solo-* namespace that no operator process watches (deleted afterwards, not waited for)."""
    cluster = chatfleet_crd
    name = f"solo-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
