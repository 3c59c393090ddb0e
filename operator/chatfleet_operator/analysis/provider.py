"""The Prometheus provider: the only module of the operator that queries metrics. Measurements never raise.

A measurement is a handful of instant queries through prometheus-api-client (canary and stable of each
check, plus the canary's request rate). Any failure -- connection refused, timeout, HTTP 4xx/5xx, a
malformed answer, a certificate that does not verify -- becomes Sample(error=...), which the assessor
counts as an Error, never a pass.

How Prometheus is reached is the operator's PrometheusSettings: an https:// address has its certificate
verified against the system's CAs or the CA file given (unless verification is explicitly skipped), and a
bearer token file, when given, is read at every query (a rotated token is used at once). A failed
verification and a refused token are explained by name (PrometheusAccessError), with the setting to change.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from chatfleet_operator.analysis import queries
from chatfleet_operator.analysis.assess import Sample
from chatfleet_operator.analysis.catalogue import MetricQuery, metric_queries
from chatfleet_operator.analysis.queries import Target
from chatfleet_operator.settings import PrometheusSettings

log = logging.getLogger("chatfleet.analysis")

#: Seconds one query may take before the measurement counts as an error.
QUERY_TIMEOUT_SECONDS = 5
#: Where each Prometheus setting is set, as the messages name it (flag of the operator, value of the chart).
CA_SETTING = "--prometheus-ca-file, chart value operator.prometheus.ca"
TOKEN_SETTING = "--prometheus-bearer-token-file, chart value operator.prometheus.bearerToken"
TOKEN_HOSTS_SETTING = "--prometheus-bearer-token-host, chart value operator.prometheus.bearerToken.hosts"


@dataclass(frozen=True)
class MeasurementRequest:
    """Everything one measurement needs: where, which tracks, which checks, which window."""

    address: str
    namespace: str
    service: str
    canary_track: str
    stable_track: str
    window_seconds: int
    metrics: tuple[MetricQuery, ...]


class Provider(Protocol):
    """Anything that can take one measurement (Prometheus here, a fake in unit tests)."""

    def measure(self, plan: MeasurementRequest, now: datetime) -> Sample:
        """One measurement of canary vs stable."""
        ...

    def query(self, address: str, promql: str) -> float | None:
        """One instant query of a single figure (None: no series); raises on any failure."""
        ...


def _scalar(result: Sequence[Mapping[str, Any]]) -> float | None:
    """The value of an instant-vector answer with one series; None when empty or NaN."""
    if not result:
        return None
    value = float(result[0]["value"][1])
    return value if math.isfinite(value) else None


class PrometheusAccessError(Exception):
    """Prometheus answered, but TLS verification failed or the credentials were refused; says what to set."""


class BearerTokenFile(requests.auth.AuthBase):
    """`Authorization: Bearer <token>` from a file read at every request (a rotated token is used at once),
    sent only over https to the hosts listed: a ChatbotService's author chooses its Prometheus address."""

    def __init__(self, path: str, hosts: Sequence[str] = ()) -> None:
        self.path = path
        self.hosts = frozenset(h.lower() for h in hosts)

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        """The request with the file's token (PrometheusAccessError when the file is missing or empty, or
        the request goes to a host not listed or over http)."""
        url = urlsplit(request.url or "")
        if url.scheme != "https" or (url.hostname or "").lower() not in self.hosts:
            raise PrometheusAccessError(
                f"the bearer token is sent only over https to {', '.join(sorted(self.hosts)) or 'no host'}, "
                f"not to {url.scheme}://{url.hostname} ({TOKEN_HOSTS_SETTING})"
            )
        try:
            token = Path(self.path).read_text().strip()
        except OSError as exc:
            raise PrometheusAccessError(
                f"the bearer token file {self.path} cannot be read ({exc.strerror or exc}; {TOKEN_SETTING})"
            ) from exc
        if not token:
            raise PrometheusAccessError(f"the bearer token file {self.path} is empty ({TOKEN_SETTING})")
        request.headers["Authorization"] = f"Bearer {token}"
        return request


class PrometheusProvider:
    """Measures with prometheus-api-client; one client per address, no retries (the next interval is one)."""

    def __init__(
        self, settings: PrometheusSettings | None = None, timeout: float = QUERY_TIMEOUT_SECONDS
    ) -> None:
        self.settings = settings or PrometheusSettings()
        self.timeout = timeout
        self._clients: dict[str, PrometheusConnect] = {}
        self._auth = (
            BearerTokenFile(self.settings.bearer_token_file, self.settings.bearer_token_hosts)
            if self.settings.bearer_token_file
            else None
        )
        if self.settings.insecure_skip_verify:
            log.warning(
                "Not verifying the TLS certificates of Prometheus (--prometheus-insecure-skip-verify)"
            )

    def _client(self, address: str) -> PrometheusConnect:
        """Cached client of one Prometheus."""
        if address not in self._clients:
            skip = self.settings.insecure_skip_verify
            session = requests.Session()
            # True: the system's CAs; a path: that CA file, loaded by each new connection; False: no check
            session.verify = False if skip else (self.settings.ca_file or True)
            session.max_redirects = 0  # the checked address is the only one called (a 3xx is an error)
            self._clients[address] = PrometheusConnect(
                url=address.rstrip("/"),
                disable_ssl=skip,  # the session's verify decides; kept in step for the reader
                retry=Retry(total=0),
                timeout=self.timeout,
                session=session,
                auth=self._auth,  # an AuthBase: requests takes one where the client hints at a tuple
            )
        return self._clients[address]

    def query(self, address: str, promql: str) -> float | None:
        """One instant query (raises on any failure; measure() catches)."""
        try:
            return _scalar(self._client(address).custom_query(promql))
        except (requests.exceptions.SSLError, PrometheusApiClientException) as exc:
            raise self._explained(exc) from exc

    def query_range(
        self, address: str, promql: str, start: datetime, end: datetime, step: int
    ) -> list[tuple[float, float]]:
        """One range query of a single series: [(unix time, value)] (raises on any failure; the caller catches)."""
        try:
            result = self._client(address).custom_query_range(
                promql, start_time=start, end_time=end, step=str(step)
            )
        except (requests.exceptions.SSLError, PrometheusApiClientException) as exc:
            raise self._explained(exc) from exc
        if not result:
            return []
        return [(float(t), float(v)) for t, v in result[0].get("values") or []]

    def _explained(self, exc: Exception) -> Exception:
        """A failed TLS verification or a refused token as a PrometheusAccessError naming the setting to
        change; any other failure as it was."""
        full = str(exc)
        if isinstance(exc, requests.exceptions.SSLError):
            verify = re.search(r"certificate verify failed: (.+?)\.? \(_ssl", full)
            if not verify:  # e.g. '[SSL: WRONG_VERSION_NUMBER] wrong version number': no TLS on that port
                ssl_reason = re.search(r"\[SSL: \w+\] (.+?) \(_ssl", full)
                reason = ssl_reason.group(1).strip() if ssl_reason else _short(exc)
                return PrometheusAccessError(f"TLS handshake failed ({reason})")
            ca = self.settings.ca_file
            hint = (
                f"the CA file {ca} did not sign its certificate for this name ({CA_SETTING})"
                if ca
                else f"set the CA that signed its certificate ({CA_SETTING})"
            )
            return PrometheusAccessError(f"TLS verification failed ({verify.group(1).strip()}): {hint}")
        status = re.match(r"HTTP Status Code (\d+)", full)
        code = int(status.group(1)) if status else 0
        token = self.settings.bearer_token_file
        if code == 401:
            what = f"the bearer token of {token} was refused" if token else "it asks for a bearer token"
            return PrometheusAccessError(f"HTTP 401 Unauthorized: {what} ({TOKEN_SETTING})")
        if code == 403:
            whose = f"the bearer token of {token}" if token else "a request without a bearer token"
            return PrometheusAccessError(f"HTTP 403 Forbidden: {whose} may not query it ({TOKEN_SETTING})")
        return exc

    def measure(self, plan: MeasurementRequest, now: datetime) -> Sample:
        """One measurement of canary vs stable; Sample(error=...) on any failure, never raises."""
        canary = Target(plan.namespace, plan.service, plan.canary_track)
        stable = Target(plan.namespace, plan.service, plan.stable_track)
        try:
            rps = self.query(plan.address, queries.request_rate(canary, plan.window_seconds)) or 0.0
            canary_figures: dict[str, float | None] = {}
            stable_figures: dict[str, float | None] = {}
            for metric in plan.metrics:
                name = metric.check.name
                canary_figures[name] = self.query(plan.address, metric.promql(canary, plan.window_seconds))
                stable_figures[name] = self.query(plan.address, metric.promql(stable, plan.window_seconds))
            return Sample(now, rps, canary_figures, stable_figures, window_seconds=plan.window_seconds)
        except Exception as exc:  # never raise: an unreachable Prometheus is an Error measurement
            message = f"Prometheus at {plan.address} did not answer: {_short(exc)}"
            log.info("Measured %s/%s: %s", plan.namespace, plan.service, message)
            return Sample(now, error=message)


def short_error(exc: BaseException) -> str:
    """First line of an exception, without the long urllib3 chains (public name of _short)."""
    return _short(exc)


def _short(exc: BaseException) -> str:
    """First line of an exception, without the long urllib3 chains."""
    if isinstance(exc, PrometheusAccessError):  # already says what failed and what to set
        return str(exc)
    full = str(exc)
    text = full.splitlines()[0] if full else type(exc).__name__
    if "Connection refused" in full:
        return "connection refused"
    if "NameResolution" in full or "resolve" in full:
        return "host name not resolved"
    if "timed out" in full.lower() or "Timeout" in full:
        return "timed out"
    if "Max retries exceeded" in full or "NewConnectionError" in full:
        return "unreachable"
    return text[:200]


def measurement_request(
    namespace: str, service: str, spec: Any, canary_track: str, stable_track: str = "stable"
) -> MeasurementRequest:
    """The measurement plan of one ChatbotService from its spec (window: two intervals, at least 10 s)."""
    a = spec.analysis
    return MeasurementRequest(
        address=a.prometheus_address,
        namespace=namespace,
        service=service,
        canary_track=canary_track,
        stable_track=stable_track,
        window_seconds=queries.window_seconds(a.interval_seconds),
        metrics=metric_queries(a),
    )
