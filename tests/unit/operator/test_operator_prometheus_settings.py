"""How Prometheus is reached: the flags and environment of PrometheusSettings, the one provider they make,
and how it explains a 403 or a failed TLS handshake (local plain-http servers).

The connections themselves (a real Prometheus over https, a bearer-token proxy) are tested in
tests/integration/operator/test_operator_prometheus_tls.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from chatfleet_operator.analysis.provider import PrometheusAccessError, PrometheusProvider, short_error
from chatfleet_operator.cli import build_settings, parse_args
from chatfleet_operator.controller import Controller
from chatfleet_operator.settings import PrometheusSettings, Settings

ENV = {
    "ca_file": "CHATFLEET_PROMETHEUS_CA_FILE",
    "bearer_token_file": "CHATFLEET_PROMETHEUS_BEARER_TOKEN_FILE",
    "bearer_token_hosts": "CHATFLEET_PROMETHEUS_BEARER_TOKEN_HOSTS",
    "insecure_skip_verify": "CHATFLEET_PROMETHEUS_INSECURE_SKIP_VERIFY",
}


@pytest.fixture(autouse=True)
def no_prometheus_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV.values():
        monkeypatch.delenv(name, raising=False)


def settings(*flags: str) -> PrometheusSettings:
    return build_settings(parse_args(["run", *flags])).prometheus


def test_defaults_verify_with_the_system_cas_and_send_no_token():
    assert settings() == PrometheusSettings(
        ca_file=None, bearer_token_file=None, bearer_token_hosts=(), insecure_skip_verify=False
    )
    session = PrometheusProvider(settings())._client("https://prometheus.monitoring.svc:9090")._session
    assert session.verify is True


@pytest.mark.parametrize(
    ("flags", "env", "expected"),
    [
        pytest.param(["--prometheus-ca-file", "/ca/ca.crt"], {}, {"ca_file": "/ca/ca.crt"}, id="ca-flag"),
        pytest.param([], {"ca_file": "/env/ca.crt"}, {"ca_file": "/env/ca.crt"}, id="ca-env"),
        pytest.param(
            ["--prometheus-ca-file", "/flag.crt"],
            {"ca_file": "/env.crt"},
            {"ca_file": "/flag.crt"},
            id="flag-wins",
        ),
        pytest.param(
            ["--prometheus-bearer-token-file", "/t/token", "--prometheus-bearer-token-host", "prom.svc"],
            {},
            {"bearer_token_file": "/t/token", "bearer_token_hosts": ("prom.svc",)},
            id="token-flag",
        ),
        pytest.param(
            [],
            {"bearer_token_file": "/e/token", "bearer_token_hosts": "a.svc,b.svc"},
            {"bearer_token_file": "/e/token", "bearer_token_hosts": ("a.svc", "b.svc")},
            id="token-env",
        ),
        pytest.param(
            ["--prometheus-insecure-skip-verify"], {}, {"insecure_skip_verify": True}, id="skip-flag"
        ),
        pytest.param([], {"insecure_skip_verify": "true"}, {"insecure_skip_verify": True}, id="skip-env"),
        pytest.param([], {"insecure_skip_verify": "false"}, {}, id="skip-env-false"),
    ],
)
def test_flags_and_environment(monkeypatch, flags, env, expected):
    for key, value in env.items():
        monkeypatch.setenv(ENV[key], value)
    base = {
        "ca_file": None,
        "bearer_token_file": None,
        "bearer_token_hosts": (),
        "insecure_skip_verify": False,
    }
    assert settings(*flags) == PrometheusSettings(**{**base, **expected})


def test_a_token_without_the_hosts_it_may_go_to_is_refused_at_start():
    with pytest.raises(
        SystemExit, match=r"--prometheus-bearer-token-file .* needs --prometheus-bearer-token-host"
    ):
        settings("--prometheus-bearer-token-file", "/t/token")


@pytest.mark.parametrize(
    "address",
    [
        pytest.param("https://evil.tenant-a.svc:9090", id="a-tenants-service"),
        pytest.param("http://prometheus.monitoring.svc:9090", id="listed-host-over-http"),
    ],
)
def test_the_token_goes_nowhere_but_the_listed_hosts_over_https(tmp_path, address):
    """A tenant writes spec.analysis.prometheusAddress: the token must not follow it to their Service."""
    token = tmp_path / "token"
    token.write_text("secret-token")
    prometheus = PrometheusSettings(
        bearer_token_file=str(token), bearer_token_hosts=("prometheus.monitoring.svc",)
    )
    sent = []
    provider = PrometheusProvider(prometheus)
    session = provider._client(address)._session
    session.send = lambda request, **kw: sent.append(request) or pytest.fail("sent")
    with pytest.raises(PrometheusAccessError, match=r"sent only over https to prometheus\.monitoring\.svc"):
        provider.query(address, "up")
    assert sent == []


def test_a_ca_with_skipped_verification_is_refused_at_start(monkeypatch):
    with pytest.raises(SystemExit, match=r"--prometheus-ca-file .* and --prometheus-insecure-skip-verify"):
        settings("--prometheus-ca-file", "/ca.crt", "--prometheus-insecure-skip-verify")
    monkeypatch.setenv(ENV["insecure_skip_verify"], "1")
    with pytest.raises(SystemExit, match="exclude each other"):
        settings("--prometheus-ca-file", "/ca.crt")


@pytest.mark.parametrize(
    ("prometheus", "verify"),
    [
        pytest.param(PrometheusSettings(), True, id="system-cas"),
        pytest.param(PrometheusSettings(ca_file="/ca/ca.crt"), "/ca/ca.crt", id="ca-file"),
        pytest.param(PrometheusSettings(insecure_skip_verify=True), False, id="skip"),
    ],
)
def test_the_controller_builds_one_provider_for_releases_and_the_forecast(prometheus, verify):
    controller = Controller(Settings(prometheus=prometheus), client=object())
    provider = controller.releases.provider
    assert isinstance(provider, PrometheusProvider) and provider.settings is prometheus
    assert controller.autoscaling._range_query.__self__ is provider  # the forecast's range query
    assert provider._client("https://prometheus.monitoring.svc:9090")._session.verify == verify


@pytest.fixture
def forbidding() -> Iterator[str]:
    """A plain-http server on 127.0.0.1 that answers 403 to everything: its host:port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(403)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_403_names_the_token_setting(forbidding, tmp_path):
    token = tmp_path / "token"
    token.write_text("t")
    with pytest.raises(PrometheusAccessError, match=r"^HTTP 403 Forbidden: a request without a bearer token"):
        PrometheusProvider(PrometheusSettings()).query(f"http://{forbidding}", "up")
    with pytest.raises(PrometheusAccessError, match="the bearer token is sent only over https"):
        PrometheusProvider(
            PrometheusSettings(bearer_token_file=str(token), bearer_token_hosts=("127.0.0.1",))
        ).query(f"http://{forbidding}", "up")


def test_https_to_a_port_without_tls_is_a_failed_handshake_not_a_verification(forbidding):
    with pytest.raises(PrometheusAccessError, match=r"^TLS handshake failed \(wrong version number\)$"):
        PrometheusProvider(PrometheusSettings()).query(f"https://{forbidding}", "up")


#: What requests raised in real runs (the URL of the pool shortened).
POOL = "HTTPSConnectionPool(host='127.0.0.1', port=1): Max retries exceeded with url: / (Caused by "


@pytest.mark.parametrize(
    ("settings", "raised", "message"),
    [
        pytest.param(
            PrometheusSettings(),
            POOL
            + "SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
            "failed: unable to get local issuer certificate (_ssl.c:1006)')))",
            "TLS verification failed (unable to get local issuer certificate): set the CA that signed its "
            "certificate (--prometheus-ca-file, chart value operator.prometheus.ca)",
            id="unknown-ca",
        ),
        pytest.param(
            PrometheusSettings(ca_file="/ca.crt"),
            POOL
            + 'SSLError(SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify '
            "failed: IP address mismatch, certificate is not valid for '127.0.0.1'. (_ssl.c:1006)\")))",
            "TLS verification failed (IP address mismatch, certificate is not valid for '127.0.0.1'): the CA "
            "file /ca.crt did not sign its certificate for this name (--prometheus-ca-file, chart value "
            "operator.prometheus.ca)",
            id="name-mismatch",
        ),
        pytest.param(
            PrometheusSettings(),
            POOL + "SSLError(SSLError(1, '[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)')))",
            "TLS handshake failed (wrong version number)",
            id="no-tls-there",
        ),
    ],
)
def test_tls_failures_are_explained(settings, raised, message):
    explained = PrometheusProvider(settings)._explained(requests.exceptions.SSLError(raised))
    assert isinstance(explained, PrometheusAccessError) and short_error(explained) == message
