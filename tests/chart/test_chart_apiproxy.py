"""The recording proxy's mapping from a request to the RBAC permission it needs (table-driven)."""

from __future__ import annotations

import pytest
from chart_apiproxy import Record

CASES = [
    pytest.param("GET", "/api", None, id="discovery-core"),
    pytest.param("GET", "/apis/apps/v1", None, id="discovery-group"),
    pytest.param("GET", "/api/v1/nodes", ("", "nodes", "list", None), id="list-cluster-scoped"),
    pytest.param(
        "GET", "/api/v1/nodes?watch=true&resourceVersion=5", ("", "nodes", "watch", None), id="watch"
    ),
    pytest.param("GET", "/api/v1/namespaces", ("", "namespaces", "list", None), id="list-namespaces"),
    pytest.param("GET", "/api/v1/namespaces/team-a", ("", "namespaces", "get", None), id="get-namespace"),
    pytest.param(
        "GET",
        "/api/v1/namespaces/team-a/secrets/redis",
        ("", "secrets", "get", "team-a"),
        id="get-namespaced",
    ),
    pytest.param(
        "GET",
        "/apis/apps/v1/namespaces/team-a/deployments?watch=1",
        ("apps", "deployments", "watch", "team-a"),
        id="watch-namespaced",
    ),
    pytest.param(
        "PATCH",
        "/apis/chatfleet.io/v1alpha1/namespaces/team-a/chatbotservices/bot/status",
        ("chatfleet.io", "chatbotservices/status", "patch", "team-a"),
        id="subresource",
    ),
    pytest.param("POST", "/api/v1/namespaces/team-a/events", ("", "events", "create", "team-a"), id="create"),
    pytest.param(
        "DELETE",
        "/apis/autoscaling/v2/namespaces/team-a/horizontalpodautoscalers/bot",
        ("autoscaling", "horizontalpodautoscalers", "delete", "team-a"),
        id="delete",
    ),
    pytest.param(
        "DELETE",
        "/api/v1/namespaces/team-a/pods",
        ("", "pods", "deletecollection", "team-a"),
        id="deletecollection",
    ),
    pytest.param(
        "PUT",
        "/apis/chatfleet.io/v1alpha1/namespaces/team-a/chatbotservices/bot/finalizers",
        ("chatfleet.io", "chatbotservices/finalizers", "update", "team-a"),
        id="update",
    ),
]


@pytest.mark.parametrize(("method", "path", "expected"), CASES)
def test_permission_of_a_request(method: str, path: str, expected: tuple | None) -> None:
    assert Record(method, path).permission() == expected


def test_server_side_apply_that_creates_also_needs_create() -> None:
    path = "/api/v1/namespaces/team-a/services/bot?fieldManager=chatfleet-operator&force=true"
    assert Record("PATCH", path, "application/apply-patch+yaml", 201).creates_by_apply()
    assert not Record("PATCH", path, "application/apply-patch+yaml", 200).creates_by_apply()
    assert not Record("PATCH", path, "application/merge-patch+json", 201).creates_by_apply()
