"""Analysis targets: the probe URL template and prometheusAddress are checked before any call.

Test design: pure table tests of the template and host checks; then `Releases.measure` and
`reconcile_pass` against real HTTP servers on 127.0.0.1 that count the requests reaching them, so
"never called" is observed, not assumed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from chatfleet_operator.analysis.assess import ERROR
from chatfleet_operator.analysis.targets import template_error, url_error
from chatfleet_operator.api import Reason
from chatfleet_operator.cache import Snapshot, World
from chatfleet_operator.cli import build_settings, parse_args
from chatfleet_operator.converge.facts import NodeFacts
from chatfleet_operator.reconcile import reconcile_pass
from chatfleet_operator.release.measure import Releases
from chatfleet_operator.settings import ReleaseSettings, Settings
from chatfleet_operator.spec import ObjectRef
from pass_helpers import context

REF = ObjectRef("ns", "bot", "uid-1", 2)
NOW = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
INCONCLUSIVE_BEFORE = {"release": {"analysis": {"lastVerdict": "Inconclusive"}}}


class Counting:
    """A real HTTP server on 127.0.0.1 that counts requests; `redirect` answers 302 to that URL."""

    def __init__(self, redirect: str = "") -> None:
        self.hits: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                outer.hits.append(self.path)
                if redirect:
                    self.send_response(302)
                    self.send_header("Location", redirect)
                    self.end_headers()
                    return
                body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server() -> Iterator[Counting]:
    s = Counting()
    yield s
    s.close()


class TestTemplate:
    @pytest.mark.parametrize(
        ("template", "problem"),
        [
            pytest.param(
                "http://{service}-{track}.{namespace}.svc.{domain}:8080/v1", None, id="all-placeholders"
            ),
            pytest.param("http://bot.ns.svc:8080/v1/chat/completions", None, id="no-placeholder"),
            pytest.param("http://{x}.svc/", "unknown placeholder {x}", id="unknown"),
            pytest.param(
                "http://{service.__class__}.svc/", "unknown placeholder {service.__class__}", id="attribute"
            ),
            pytest.param("http://{service!r}.svc/", "conversions and format specs", id="conversion"),
            pytest.param("http://{}.svc/", "unknown placeholder {}", id="positional"),
            pytest.param("http://{service.svc/", "unbalanced", id="unclosed"),
            pytest.param("http://service}.svc/", "unbalanced", id="unopened"),
        ],
    )
    def test_template(self, template, problem):
        found = template_error(template)
        assert (found is None) if problem is None else (problem in found), found


class TestHosts:
    @pytest.mark.parametrize(
        ("url", "allowed", "ok"),
        [
            pytest.param("http://prometheus.monitoring.svc:9090", (), True, id="svc"),
            pytest.param("http://prometheus.monitoring.svc.cluster.local:9090", (), True, id="svc-domain"),
            pytest.param("https://prometheus.monitoring.svc.cluster.local./", (), True, id="svc-domain-dot"),
            pytest.param("http://prometheus.example.com:9090", (), False, id="external"),
            pytest.param("http://prometheus.monitoring.svc.evil.com", (), False, id="svc-not-suffix"),
            pytest.param("http://127.0.0.1:9090", (), False, id="loopback-default"),
            pytest.param("http://localhost:9090", (), False, id="localhost-default"),
            pytest.param("http://[::1]:9090", (), False, id="ipv6-loopback"),
            pytest.param("http://2130706433:9090", (), False, id="decimal-ip"),
            pytest.param("http://169.254.169.254/latest/meta-data", (), False, id="metadata-service"),
            pytest.param("http://a.svc@evil.com/", (), False, id="userinfo"),
            pytest.param("http://evil.com\\@a.svc/", (), False, id="backslash"),
            pytest.param("ftp://a.svc/", (), False, id="scheme"),
            pytest.param("http://127.0.0.1:9090", ("127.0.0.1",), True, id="loopback-allowed"),
            pytest.param("http://127.0.0.1:9090", ("127.0.0.0/8",), True, id="loopback-cidr"),
            pytest.param("http://10.96.0.10:9090", ("10.96.0.0/12",), True, id="service-cidr"),
            pytest.param("http://10.128.0.1:9090", ("10.96.0.0/12",), False, id="outside-cidr"),
            pytest.param("http://prom.corp.example:9090", ("*.corp.example",), True, id="wildcard"),
            pytest.param("http://corp.example:9090", ("*.corp.example",), False, id="wildcard-needs-a-label"),
        ],
    )
    def test_host(self, url, allowed, ok):
        assert (url_error(url, allowed, "cluster.local") is None) is ok


def measure(raw, settings=None, status=None):
    releases = Releases(settings or ReleaseSettings())
    return releases.measure(context(raw, status=status or INCONCLUSIVE_BEFORE, now=NOW, ref=REF))


def spec_with(prometheus, probe_url=None):
    analysis = {"prometheusAddress": prometheus, "intervalSeconds": 10}
    if probe_url is not None:
        analysis["probe"] = {"enabled": True, "url": probe_url, "requests": 2}
    return {"model": {"uri": "hf://org/m"}, "analysis": analysis}


class TestMeasure:
    def test_malformed_probe_template_is_an_error_measurement_not_a_crash(self, server):
        allowed = ReleaseSettings(analysis_allowed_hosts=("127.0.0.1",))
        m = measure(spec_with(server.url, "http://{x}/probe"), allowed)
        assert m.verdict == ERROR and "spec.analysis.probe.url" in m.message
        assert server.hits == []

    def test_loopback_prometheus_is_not_called_by_default(self, server):
        m = measure(spec_with(server.url))
        assert m.verdict == ERROR and "spec.analysis.prometheusAddress" in m.message
        assert server.hits == []

    def test_loopback_probe_is_not_called_by_default(self, server):
        m = measure(spec_with("http://prometheus.monitoring.svc:9090", server.url + "/probe/{track}"))
        assert m.verdict == ERROR and "spec.analysis.probe.url" in m.message
        assert server.hits == []

    def test_allowed_by_the_operator_setting(self, server):
        allowed = ReleaseSettings(analysis_allowed_hosts=("127.0.0.1",))
        measure(spec_with(server.url, server.url + "/probe/{track}"), allowed)
        assert "/probe/canary" in server.hits and any(h.startswith("/api/v1/query") for h in server.hits)

    def test_redirects_are_not_followed(self, server):
        bouncer = Counting(redirect=server.url + "/elsewhere")
        try:
            allowed = ReleaseSettings(analysis_allowed_hosts=("127.0.0.1",))
            m = measure(spec_with(bouncer.url, bouncer.url + "/probe/{track}"), allowed)
        finally:
            bouncer.close()
        assert bouncer.hits and server.hits == []
        assert m.verdict == ERROR


class TestPass:
    NODES = [NodeFacts("gpu-node-0", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, 8)]

    class Client:
        def __init__(self) -> None:
            self.events: list[tuple[str, str, str]] = []
            self.rv = 1

        def apply(self, manifest):
            self.rv += 1
            return {**manifest, "metadata": {**manifest["metadata"], "resourceVersion": str(self.rv)}}

        def delete(self, kind, namespace, name):
            pass

        def patch_status(self, namespace, name, patch):
            return {}

        def post_event(self, involved, type_, reason, message, now=None):
            self.events.append((type_, reason, message))

    @pytest.mark.parametrize(
        ("analysis", "field"),
        [
            pytest.param(
                {"prometheusAddress": "http://prometheus.example.com:9090"},
                "spec.analysis.prometheusAddress",
                id="prometheus",
            ),
            pytest.param(
                {"probe": {"enabled": True, "url": "http://{x}.svc/"}},
                "spec.analysis.probe.url",
                id="template",
            ),
            pytest.param(
                {"probe": {"enabled": True, "url": "http://10.0.0.1/"}},
                "spec.analysis.probe.url",
                id="probe-host",
            ),
        ],
    )
    def test_condition_and_event_name_the_field(self, analysis, field):
        client = self.Client()
        body = {
            "metadata": {"name": "bot", "namespace": "ns", "uid": "u", "generation": 1},
            "spec": {"model": {"uri": "hf://org/m"}, "analysis": analysis},
        }
        outcome = reconcile_pass(client, body, Snapshot(nodes=self.NODES), World(), Settings(), NOW)
        stalled = next(c for c in outcome.status["conditions"] if c["type"] == "Stalled")
        assert (stalled["status"], stalled["reason"]) == ("True", Reason.INVALID_ANALYSIS_TARGET)
        assert field in stalled["message"]
        assert [(t, r) for t, r, _ in client.events] == [("Warning", Reason.INVALID_ANALYSIS_TARGET)]
        assert field in client.events[0][2]


class TestSetting:
    def test_flag_and_env(self, monkeypatch):
        monkeypatch.setenv("CHATFLEET_ANALYSIS_ALLOWED_HOSTS", "10.96.0.0/12, *.corp.example")
        from_env = build_settings(parse_args(["run"]))
        assert from_env.release.analysis_allowed_hosts == ("10.96.0.0/12", "*.corp.example")
        flags = ["run", "--analysis-allowed-host", "127.0.0.1", "--analysis-allowed-host", "::1"]
        assert build_settings(parse_args(flags)).release.analysis_allowed_hosts == ("127.0.0.1", "::1")

    def test_gateway_mirror_flag_env_and_a_clear_refusal(self, monkeypatch):
        monkeypatch.delenv("CHATFLEET_GATEWAY_MIRROR", raising=False)
        assert build_settings(parse_args(["run"])).release.gateway_mirror == "RequestMirror"
        monkeypatch.setenv("CHATFLEET_GATEWAY_MIRROR", "TraefikService")
        assert build_settings(parse_args(["run"])).release.gateway_mirror == "TraefikService"
        flags = ["run", "--gateway-mirror", "RequestMirror"]
        assert build_settings(parse_args(flags)).release.gateway_mirror == "RequestMirror"
        monkeypatch.setenv("CHATFLEET_GATEWAY_MIRROR", "Mirror")
        with pytest.raises(
            SystemExit, match="CHATFLEET_GATEWAY_MIRROR must be RequestMirror or TraefikService"
        ):
            build_settings(parse_args(["run"]))

    def test_default_allows_nothing_outside_the_cluster(self, monkeypatch):
        monkeypatch.delenv("CHATFLEET_ANALYSIS_ALLOWED_HOSTS", raising=False)
        assert build_settings(parse_args(["run"])).release.analysis_allowed_hosts == ()
