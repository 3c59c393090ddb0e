"""The release analysis against a real Prometheus that serves only https, and behind a bearer-token proxy.

Test design: the platform's Prometheus (built from Go modules) serves https with a certificate signed by
a CA of the test's own (`--web.config.file` with `tls_server_config`; services.Prometheus(tls=...)).
Prometheus' web config knows basic auth but no bearer tokens, so for the token cases a BearerProxy
(services.py: an https reverse proxy on 127.0.0.1 that answers 401 unless `Authorization: Bearer
<token>` matches) stands in front of it, as kube-rbac-proxy would, and records the header each request
brought. The provider is the one the operator's Controller builds from its command line, so flags,
settings and wiring are all on the path. Each case takes one measurement, assessed as a release would
be: its check asks `vector(7)`, so a measurement that reached Prometheus has 7 for canary and stable
(and is Inconclusive, the platform serving no chat traffic); one that did not is an Error whose message
says why and which setting to set.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import urllib3
from chatfleet_operator.analysis.assess import ERROR, INCONCLUSIVE, Check, Measurement, assess
from chatfleet_operator.analysis.catalogue import MetricQuery
from chatfleet_operator.analysis.provider import (
    MeasurementRequest,
    PrometheusAccessError,
    PrometheusProvider,
    short_error,
)
from chatfleet_operator.cli import build_settings, parse_args
from chatfleet_operator.controller import Controller
from chatfleet_platform.common import pki
from chatfleet_platform.servers import services

pytestmark = [pytest.mark.prometheus]

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
CHECK = Check("answer", max_value=10.0)
TOKEN = "t0ken-for-prometheus"
ENV = (
    "CHATFLEET_PROMETHEUS_CA_FILE",
    "CHATFLEET_PROMETHEUS_BEARER_TOKEN_FILE",
    "CHATFLEET_PROMETHEUS_INSECURE_SKIP_VERIFY",
)


@pytest.fixture(autouse=True)
def no_prometheus_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the flags each test passes decide (the environment of the run must not)."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def https_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[services.Prometheus]:
    """A real Prometheus on 127.0.0.1 serving https only, its certificate signed by a test CA."""
    workdir = tmp_path_factory.mktemp("prometheus-tls")
    tls = pki.serving_pair(workdir / "pki", "prometheus")
    with services.Prometheus(workdir / "server", tls=tls) as prometheus:
        yield prometheus


@pytest.fixture(scope="module")
def proxy(https_prometheus, tmp_path_factory) -> Iterator[services.BearerProxy]:
    """The bearer-token proxy in front of it (https with a CA of its own), requiring TOKEN."""
    p = services.BearerProxy(
        tmp_path_factory.mktemp("bearer-proxy"),
        upstream=https_prometheus.url,
        token=TOKEN,
        upstream_context=https_prometheus.ssl_context,
    )
    with p:
        yield p


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    """A token file holding TOKEN, as a mounted Secret or projected token would."""
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def operator_provider(*flags: str) -> PrometheusProvider:
    """The provider the operator's Controller builds from `chatfleet-operator run <flags>`."""
    controller = Controller(build_settings(parse_args(["run", *flags])), client=object())
    provider = controller.releases.provider
    assert isinstance(provider, PrometheusProvider)
    return provider


def measure(provider: PrometheusProvider, address: str) -> tuple[Measurement, dict]:
    """One measurement of a check answering `vector(7)`: (the assessed measurement, canary figures)."""
    plan = MeasurementRequest(
        address=address,
        namespace="ns",
        service="bot",
        canary_track="canary",
        stable_track="stable",
        window_seconds=10,
        metrics=(MetricQuery(CHECK, lambda target, window: "vector(7)"),),
    )
    sample = provider.measure(plan, NOW)
    return assess(sample, [CHECK]), dict(sample.canary)


def assert_reached(measurement: Measurement, canary: dict) -> None:
    """The measurement reached Prometheus: no error, the figure answered."""
    assert measurement.verdict == INCONCLUSIVE, measurement.message  # reached, but no chat traffic
    assert canary == {"answer": 7.0}


class TestVerification:
    def test_the_ca_that_signed_it_verifies_and_the_query_works(self, https_prometheus):
        provider = operator_provider("--prometheus-ca-file", str(https_prometheus.tls[0]))
        assert_reached(*measure(provider, https_prometheus.url))

    def test_default_settings_refuse_an_unknown_ca_as_an_error_naming_the_setting(self, https_prometheus):
        measurement, canary = measure(operator_provider(), https_prometheus.url)
        assert measurement.verdict == ERROR  # counted apart from failures: never a pass, never a rollback
        assert canary == {}
        assert measurement.message.startswith(
            f"Prometheus at {https_prometheus.url} did not answer: TLS verification failed ("
        ), measurement.message
        assert "set the CA that signed its certificate" in measurement.message
        assert "--prometheus-ca-file, chart value operator.prometheus.ca" in measurement.message

    def test_a_ca_that_did_not_sign_it_is_an_error_naming_that_file(self, https_prometheus, tmp_path):
        other_ca, _, _ = pki.serving_pair(tmp_path, "someone-else")
        measurement, _ = measure(
            operator_provider("--prometheus-ca-file", str(other_ca)), https_prometheus.url
        )
        assert measurement.verdict == ERROR
        assert "TLS verification failed (" in measurement.message
        assert f"the CA file {other_ca} did not sign its certificate" in measurement.message

    def test_insecure_skip_verify_reaches_it_without_the_ca(self, https_prometheus):
        provider = operator_provider("--prometheus-insecure-skip-verify")
        # urllib3 warns of each unverified request
        with pytest.warns(urllib3.exceptions.InsecureRequestWarning):
            assert_reached(*measure(provider, https_prometheus.url))

    def test_the_forecast_range_query_explains_a_failed_verification_too(self, https_prometheus):
        controller = Controller(build_settings(parse_args(["run"])), client=object())
        with pytest.raises(PrometheusAccessError, match="TLS verification failed") as caught:
            controller.autoscaling._range_query(
                https_prometheus.url, "vector(1)", NOW - timedelta(minutes=5), NOW, 60
            )
        assert "--prometheus-ca-file" in short_error(caught.value)  # what status.autoscaling.forecast says

    def test_http_addresses_keep_working_with_and_without_a_ca(self, make_prometheus, https_prometheus):
        plain = make_prometheus()
        assert plain.url.startswith("http://")
        assert_reached(*measure(operator_provider(), plain.url))
        assert_reached(
            *measure(operator_provider("--prometheus-ca-file", str(https_prometheus.tls[0])), plain.url)
        )


class TestBearerToken:
    def test_the_token_arrives_as_an_authorization_header(self, proxy, token_file):
        provider = operator_provider(
            "--prometheus-ca-file",
            str(proxy.ca),
            "--prometheus-bearer-token-host",
            "127.0.0.1",
            "--prometheus-bearer-token-file",
            str(token_file),
        )
        proxy.seen.clear()
        assert_reached(*measure(provider, proxy.url))
        assert proxy.seen and set(proxy.seen) == {f"Bearer {TOKEN}"}

    def test_no_token_where_one_is_required_is_an_error_naming_the_setting(self, proxy):
        proxy.seen.clear()
        measurement, _ = measure(operator_provider("--prometheus-ca-file", str(proxy.ca)), proxy.url)
        assert proxy.seen == [None]  # reached the proxy without a header, and stopped at the first query
        assert measurement.verdict == ERROR
        assert measurement.message.endswith(
            "HTTP 401 Unauthorized: it asks for a bearer token "
            "(--prometheus-bearer-token-file, chart value operator.prometheus.bearerToken)"
        ), measurement.message

    def test_a_wrong_token_is_an_error_naming_its_file(self, proxy, tmp_path):
        wrong = tmp_path / "wrong"
        wrong.write_text("not-the-token")
        provider = operator_provider(
            "--prometheus-ca-file",
            str(proxy.ca),
            "--prometheus-bearer-token-host",
            "127.0.0.1",
            "--prometheus-bearer-token-file",
            str(wrong),
        )
        measurement, _ = measure(provider, proxy.url)
        assert measurement.verdict == ERROR
        assert f"HTTP 401 Unauthorized: the bearer token of {wrong} was refused" in measurement.message

    def test_a_rotated_token_is_used_at_the_next_query(self, proxy, token_file):
        provider = operator_provider(
            "--prometheus-ca-file",
            str(proxy.ca),
            "--prometheus-bearer-token-host",
            "127.0.0.1",
            "--prometheus-bearer-token-file",
            str(token_file),
        )
        assert_reached(*measure(provider, proxy.url))
        try:
            proxy.token = "rotated-token"  # the proxy takes only the new token ...
            assert measure(provider, proxy.url)[0].verdict == ERROR
            token_file.write_text("rotated-token")  # ... which the kubelet then writes into the file
            proxy.seen.clear()
            assert_reached(*measure(provider, proxy.url))  # the same provider, no restart
            assert set(proxy.seen) == {"Bearer rotated-token"}
        finally:
            proxy.token = TOKEN

    def test_a_missing_token_file_is_an_error_naming_it(self, proxy, tmp_path):
        absent = tmp_path / "absent"
        provider = operator_provider(
            "--prometheus-ca-file",
            str(proxy.ca),
            "--prometheus-bearer-token-host",
            "127.0.0.1",
            "--prometheus-bearer-token-file",
            str(absent),
        )
        measurement, _ = measure(provider, proxy.url)
        assert measurement.verdict == ERROR
        assert f"the bearer token file {absent} cannot be read" in measurement.message
