"""Monitoring: the PrometheusRule passes `promtool test rules`, the monitors and the dashboard query real names.

Test design: the rules are rendered by `helm template` (default thresholds) and unpacked into a plain rule
file beside the promtool test file (tests/chart/prometheus/), so promtool checks what the chart ships,
thresholds substituted.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from chart_helpers import CHART, find, one, render
from needs import need_executable

TESTS = Path(__file__).parent / "prometheus" / "chatfleet_rules_test.yaml"
ALL_ON = [
    "monitoring.fleetPodMonitor.enabled=true",
    "monitoring.operatorPodMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.kubeStateMetrics.enabled=true",
    "monitoring.dashboard.enabled=true",
]
#: Series the rules and the dashboard may read: the runtime's (runtime/chatfleet_runtime/chat/metrics.py and the
#: Triton model), Triton's built-ins, kube-state-metrics' ChatbotService series (files/kube-state-metrics.yaml),
#: the operator's own (operator/chatfleet_operator/metrics.py) and the rules' own recordings.
KNOWN_PREFIXES = ("chatfleet_", "nv_", "chatbotservice:")


def promtool() -> str:
    """promtool, or fail with how to install it."""
    return need_executable("promtool", "run `make setup` (or `make system-deps`: Debian package prometheus)")


def rule_groups(sets: list[str]) -> list[dict]:
    """spec.groups of the rendered PrometheusRule."""
    return one(render(["monitoring.prometheusRule.enabled=true", *sets]), "PrometheusRule")["spec"]["groups"]


def write_rules(tmp_path: Path, sets: list[str]) -> Path:
    """Rule file + promtool test file side by side in tmp_path; returns the test file."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups(sets)}))
    shutil.copy(TESTS, tmp_path / TESTS.name)
    return tmp_path / TESTS.name


def test_rules_pass_promtool_check(tmp_path: Path) -> None:
    write_rules(tmp_path, [])
    proc = subprocess.run(
        [promtool(), "check", "rules", str(tmp_path / "rules.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_alerts_pass_promtool_unit_tests(tmp_path: Path) -> None:
    test_file = write_rules(tmp_path, [])
    proc = subprocess.run(
        [promtool(), "test", "rules", test_file.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_unit_tests_notice_a_changed_threshold(tmp_path: Path) -> None:
    """The promtool tests are sharp: a latency threshold of 2 s no longer fires on the 0.995 s service."""
    test_file = write_rules(tmp_path, ["monitoring.prometheusRule.latencyP99Seconds=2"])
    proc = subprocess.run(
        [promtool(), "test", "rules", test_file.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "ChatbotServiceHighLatency" in proc.stdout + proc.stderr


def test_every_expected_alert_exists_and_is_tested() -> None:
    alerts = {r["alert"] for g in rule_groups([]) for r in g["rules"] if "alert" in r}
    assert alerts == {
        "ChatbotServiceHighLatency",
        "ChatbotServiceHighErrorRate",
        "ChatbotServiceGPUSaturated",
        "ChatbotServiceTrafficDrop",
        "ChatbotServiceReleaseRolledBack",
        "ChatfleetOperatorReconcileStuck",
        "ChatfleetOperatorHandlersHeld",
    }
    tests = yaml.safe_load(TESTS.read_text())["tests"]
    tested = {t["alertname"] for group in tests for t in group.get("alert_rule_test", [])}
    assert tested == alerts
    # every alert has a case where it fires
    firing = {t["alertname"] for g in tests for t in g.get("alert_rule_test", []) if t["exp_alerts"]}
    assert firing == alerts


def test_alert_labels_are_configurable() -> None:
    groups = rule_groups(["monitoring.prometheusRule.alertLabels.team=ml-platform"])
    for rule in (r for g in groups for r in g["rules"] if "alert" in r):
        assert rule["labels"]["team"] == "ml-platform"
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert {"summary", "description"} <= rule["annotations"].keys()


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (identifiers followed by { or [ or a space, minus keywords)."""
    words = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[{\[]", expr))
    words |= set(re.findall(r"\b((?:chatfleet_|nv_|chatbotservice:)[a-zA-Z0-9_:]*)", expr))
    return {w for w in words if w.startswith(KNOWN_PREFIXES) or "_" in w} - {"label_values"}


def test_rules_and_dashboard_read_only_known_series() -> None:
    docs = render(ALL_ON)
    exprs = [r["expr"] for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    dashboard = json.loads(
        one([d for d in docs if d["metadata"]["name"].endswith("-dashboard")], "ConfigMap")["data"][
            "chatfleet-fleets.json"
        ]
    )
    exprs += [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    names = set().union(*(metric_names(e) for e in exprs))
    unknown = {n for n in names if not n.startswith(KNOWN_PREFIXES)}
    assert not unknown, f"series of unknown origin: {unknown}"
    operator_series = {n for n in names if n.startswith("chatfleet_operator_")}
    assert operator_series, "no rule or panel reads the operator's own metrics"
    assert not operator_series - operator_metric_names(), "series the operator does not export"


def operator_metric_names() -> set[str]:
    """Every series name the operator's metrics module exports (counters' _total, histograms' parts)."""
    from chatfleet_operator import metrics
    from prometheus_client.metrics import MetricWrapperBase

    out: set[str] = set()
    for obj in vars(metrics).values():
        if isinstance(obj, MetricWrapperBase):
            for family in obj.describe():
                out |= {family.name + suffix for suffix in ("", "_total", "_bucket", "_count", "_sum")}
    return out


def test_dashboard_covers_the_required_panels() -> None:
    dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
    titles = " | ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in (
        "latency",
        "time to first token",
        "tokens per second",
        "gpu utilization",
        "batch size",
        "canary weight",
        "reconcile passes",
        "reconcile duration",
        "oldest unfinished pass",
        "api requests",
        "rolled back",
        "rollback",
    ):
        assert topic in titles, f"no panel about {topic}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert dashboard["uid"] == "chatfleet-fleets"


def test_fleet_podmonitor_scrapes_the_pods_scrape_port_with_service_labels() -> None:
    from chatfleet_operator.builders.deployment import SCRAPE_PATH, SCRAPE_PORT_NAME

    docs = render(["monitoring.fleetPodMonitor.enabled=true"])
    monitor = next(d for d in docs if d["kind"] == "PodMonitor" and d["metadata"]["name"].endswith("-fleets"))
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    # One scrape contract: the chat API's port, which re-exports Triton's metrics (no double scrape).
    assert [(e["port"], e["path"]) for e in endpoints] == [(SCRAPE_PORT_NAME, SCRAPE_PATH)]
    for e in endpoints:
        targets = {r["targetLabel"] for r in e["relabelings"]}
        assert targets == {
            "chatbotservice",
            "track",
            "revision",
            "serving",
        }  # serving: KEDA leaves standbys out
    scoped = render(
        ["monitoring.fleetPodMonitor.enabled=true", "watch.scope=namespaces", "watch.namespaces={a,b}"]
    )
    fleet_monitors = [
        m for m in find(scoped, "PodMonitor") if m["metadata"]["name"].endswith(("-fleets", "-relays"))
    ]
    assert len(fleet_monitors) == 2
    for monitor in fleet_monitors:
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["a", "b"]}


def test_relay_podmonitor_scrapes_the_relay_pods_metrics_port_by_chatbotservice() -> None:
    """The stream relays carry no chatfleet.io/service label, so the fleets' monitor misses them: a monitor
    of their own, on the port the operator gives the relay container, labelled by their ChatbotService."""
    from chatfleet_operator.builders.relay import RELAY_METRICS_PORT, build_relay
    from chatfleet_operator.spec import ChatbotServiceSpec, ObjectRef

    assert not [d for d in render([]) if d["kind"] == "PodMonitor"]
    docs = render(["monitoring.fleetPodMonitor.enabled=true"])
    monitor = next(d for d in docs if d["kind"] == "PodMonitor" and d["metadata"]["name"].endswith("-relays"))
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    spec = ChatbotServiceSpec.from_dict({"streamRelay": {"enabled": True}})
    pod = build_relay(ObjectRef("ns", "bot", "uid"), spec, "10.96.0.9")[0]["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert "chatfleet.io/service" not in labels
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics" and ports[endpoint["port"]] == RELAY_METRICS_PORT
    # Prometheus names a pod label __meta_kubernetes_pod_label_<the name, every other character as _>
    meta = {"__meta_kubernetes_pod_label_" + re.sub("[^a-zA-Z0-9_]", "_", k): v for k, v in labels.items()}
    (relabel,) = endpoint["relabelings"]
    assert [meta[s] for s in relabel["sourceLabels"]] == ["bot"]
    assert relabel["targetLabel"] == "chatbotservice"


def test_kube_state_metrics_config_exposes_the_series_the_rules_use() -> None:
    docs = render(["monitoring.kubeStateMetrics.enabled=true"])
    config = yaml.safe_load(one(docs, "ConfigMap")["data"]["chatbotservice.yaml"])
    (resource,) = config["spec"]["resources"]
    assert resource["groupVersionKind"] == {
        "group": "chatfleet.io",
        "version": "v1alpha1",
        "kind": "ChatbotService",
    }
    names = {f"{resource['metricNamePrefix']}_{m['name']}" for m in resource["metrics"]}
    for needed in (
        "chatfleet_chatbotservice_abort_info",
        "chatfleet_chatbotservice_canary_weight",
        "chatfleet_chatbotservice_failed_checks",
        "chatfleet_chatbotservice_release_info",
    ):
        assert needed in names
    crd = yaml.safe_load((CHART / "crds" / "chatfleet.io_chatbotservices.yaml").read_text())
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    for metric in resource["metrics"]:
        spec = metric["each"].get("gauge") or metric["each"].get("info")
        paths = [spec["path"]] if "path" in spec else list(spec.get("labelsFromPath", {}).values())
        for path in paths:
            if path and path[0] == "status":
                assert path[1] in status, (
                    f"{metric['name']} reads status.{path[1]}, which the CRD does not define"
                )


@pytest.mark.parametrize(
    ("sets", "on"),
    [
        pytest.param([], False, id="all-off"),
        pytest.param(["monitoring.fleetPodMonitor.enabled=true"], True, id="with-the-fleet-podmonitor"),
        pytest.param(["monitoring.prometheusRule.enabled=true"], True, id="with-the-rules"),
        pytest.param(["monitoring.dashboard.enabled=true"], False, id="dashboard-alone-needs-no-crds"),
        pytest.param(["monitoring.operatorPodMonitor.enabled=true"], True, id="on-by-itself"),
        pytest.param(
            ["monitoring.fleetPodMonitor.enabled=true", "monitoring.operatorPodMonitor.enabled=false"],
            False,
            id="off-by-itself",
        ),
    ],
)
def test_the_operator_serves_and_is_scraped_when_monitoring_is_on(sets: list[str], on: bool) -> None:
    """The flag, the container port, the NetworkPolicy's port and the PodMonitor go together."""
    docs = render(sets)
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    monitors = [
        d
        for d in docs
        if d["kind"] == "PodMonitor" and not d["metadata"]["name"].endswith(("-fleets", "-relays"))
    ]
    ingress_ports = [p["port"] for p in one(docs, "NetworkPolicy")["spec"]["ingress"][0]["ports"]]
    if not on:
        assert not [a for a in container["args"] if a.startswith("--metrics")]
        assert "metrics" not in [p["name"] for p in container["ports"]]
        assert monitors == [] and ingress_ports == [8080]
        return
    assert "--metrics-port=9090" in container["args"]
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    assert ingress_ports == [8080, 9090]
    (monitor,) = monitors
    assert [(e["port"], e["path"]) for e in monitor["spec"]["podMetricsEndpoints"]] == [
        ("metrics", "/metrics")
    ]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"].items()


def test_monitoring_is_off_by_default() -> None:
    kinds = {d["kind"] for d in render()}
    assert not kinds & {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
    assert all(not d["metadata"]["name"].endswith(("-dashboard", "-kube-state-metrics")) for d in render())


def test_kedas_gpu_average_reads_the_serving_pods_the_podmonitor_labels(tmp_path: Path) -> None:
    """The operator's KEDA GPU query over series labelled as the chart's PodMonitor labels them: two busy
    serving pods (90 %) and two idle warm-pool standbys give 90, not the 45 that would keep a busy fleet
    with a pool from ever scaling up. Evaluated by promtool on Prometheus' own engine."""
    from chatfleet_operator.builders.scaledobject import trigger_queries
    from chatfleet_operator.spec import Autoscale, AutoscaleTargets, ObjectRef

    docs = render(["monitoring.fleetPodMonitor.enabled=true", "monitoring.operatorPodMonitor.enabled=false"])
    (monitor,) = [d for d in find(docs, "PodMonitor") if d["metadata"]["name"].endswith("-fleets")]
    relabel = monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_label_chatfleet_io_serving"],
        "targetLabel": "serving",
    } in relabel

    ((_, _, query, _),) = trigger_queries(
        ObjectRef("shop", "bot", "uid"), Autoscale(1, 8, AutoscaleTargets(gpu_utilization_percent=70), 60)
    )
    (tmp_path / "rules.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "keda", "rules": [{"record": "keda_gpu", "expr": query}]}]})
    )
    series = [
        ("bot-5d9f8c7b6-abcde", "true", "0.9"),
        ("bot-5d9f8c7b6-fghij", "true", "0.9"),
        ("bot-5d9f8c7b6-klmno", "false", "0"),
        ("bot-5d9f8c7b6-pqrst", "false", "0"),
        ("other-5d9f8c7b6-uvwxy", "true", "0.1"),  # another ChatbotService: not counted
    ]
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": f'nv_gpu_utilization{{namespace="shop",pod="{pod}",serving="{serving}"}}',
                        "values": f"{value}x5",
                    }
                    for pod, serving, value in series
                ],
                "promql_expr_test": [
                    {
                        "expr": "keda_gpu",
                        "eval_time": "2m",
                        "exp_samples": [{"labels": "keda_gpu", "value": 90}],
                    }
                ],
            }
        ],
    }
    (tmp_path / "keda_test.yaml").write_text(yaml.safe_dump(test))
    proc = subprocess.run(
        [promtool(), "test", "rules", "keda_test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
