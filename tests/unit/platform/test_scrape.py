"""A PodMonitor as Prometheus scrape configs, the way the Prometheus Operator generates them."""

from __future__ import annotations

from pathlib import Path

import pytest
from chatfleet_platform.addons.scrape import podmonitor_scrape_configs, selector_rules

pytestmark = pytest.mark.harness  # tests of the local platform (test infrastructure)

PODMONITOR = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PodMonitor",
    "metadata": {"name": "cf-fleets", "namespace": "chatfleet-system"},
    "spec": {
        "namespaceSelector": {"any": True},
        "selector": {
            "matchExpressions": [
                {"key": "chatfleet.io/service", "operator": "Exists"},
                {"key": "app.kubernetes.io/managed-by", "operator": "In", "values": ["chatfleet-operator"]},
            ]
        },
        "podMetricsEndpoints": [
            {
                "port": "chat",
                "path": "/metrics",
                "interval": "15s",
                "relabelings": [
                    {
                        "sourceLabels": ["__meta_kubernetes_pod_label_chatfleet_io_track"],
                        "targetLabel": "track",
                    }
                ],
            }
        ],
    },
}


def test_endpoint_becomes_pod_discovery_with_the_monitors_relabelling():
    (cfg,) = podmonitor_scrape_configs(PODMONITOR, api_server="https://127.0.0.1:6443", pki_dir=Path("/p"))
    assert cfg["kubernetes_sd_configs"][0]["role"] == "pod"
    assert "namespaces" not in cfg["kubernetes_sd_configs"][0], "namespaceSelector any: all namespaces"
    assert cfg["scrape_interval"] == "15s" and cfg["metrics_path"] == "/metrics"
    rules = cfg["relabel_configs"]
    assert {
        "action": "keep",
        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": "chat",
    } in rules
    assert {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"} in rules
    assert rules[-1] == {
        "source_labels": ["__meta_kubernetes_pod_label_chatfleet_io_track"],
        "target_label": "track",
    }


def test_interval_override_and_namespace_list():
    pm = {**PODMONITOR, "spec": {**PODMONITOR["spec"], "namespaceSelector": {"matchNames": ["a", "b"]}}}
    (cfg,) = podmonitor_scrape_configs(pm, api_server="x", pki_dir=Path("/p"), scrape_interval="1s")
    assert cfg["scrape_interval"] == "1s"
    assert cfg["kubernetes_sd_configs"][0]["namespaces"] == {"names": ["a", "b"]}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        pytest.param(
            {"matchLabels": {"app": "x"}},
            [
                {
                    "action": "keep",
                    "source_labels": [
                        "__meta_kubernetes_pod_label_app",
                        "__meta_kubernetes_pod_labelpresent_app",
                    ],
                    "regex": "(x);true",
                }
            ],
            id="matchLabels",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "a.b/c", "operator": "DoesNotExist"}]},
            [
                {
                    "action": "drop",
                    "source_labels": ["__meta_kubernetes_pod_labelpresent_a_b_c"],
                    "regex": "true",
                }
            ],
            id="DoesNotExist",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["a", "b"]}]},
            [
                {
                    "action": "drop",
                    "source_labels": [
                        "__meta_kubernetes_pod_label_t",
                        "__meta_kubernetes_pod_labelpresent_t",
                    ],
                    "regex": "(a|b);true",
                }
            ],
            id="NotIn",
        ),
    ],
)
def test_selector_rules(selector, expected):
    assert selector_rules(selector) == expected


def test_unknown_operator_is_refused():
    with pytest.raises(ValueError, match="Gt"):
        selector_rules({"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["1"]}]})
