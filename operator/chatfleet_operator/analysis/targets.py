"""Which URLs the release analysis may call. Pure: no I/O, no name resolution.

`spec.analysis.prometheusAddress` and `spec.analysis.probe.url` are written by whoever may edit a
ChatbotService in any namespace, and the operator calls them from inside the cluster. By default only
cluster-internal Service names are allowed (hosts ending in `.svc` or `.svc.<cluster domain>`); the
operator setting `analysis_allowed_hosts` (flag `--analysis-allowed-host`, env
`CHATFLEET_ANALYSIS_ALLOWED_HOSTS`, chart value `operator.analysisAllowedHosts`) adds exact hosts,
`*.suffix` wildcards, IP addresses and CIDRs (e.g. the Service CIDR, or 127.0.0.1 on a laptop cluster).
"""

from __future__ import annotations

import ipaddress
import string
from collections.abc import Sequence
from urllib.parse import urlsplit

from chatfleet_operator.spec import ProbeSpec

#: Placeholders a probe URL template may use.
PLACEHOLDERS = ("namespace", "service", "track", "domain")
_PLACEHOLDER_LIST = ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)


def template_error(template: str) -> str | None:
    """Why a probe URL template cannot be filled in, or None.

    Examples: 'http://{service}-{track}.{namespace}.svc.{domain}/' -> None;
    'http://{x}/' -> 'unknown placeholder {x} ...'; 'http://{service/' -> 'unbalanced braces ...'.
    """
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        return f"unbalanced braces ({exc}); write {{{{ and }}}} for literal braces"
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in PLACEHOLDERS:
            return f"unknown placeholder {{{name}}}; the placeholders are {_PLACEHOLDER_LIST}"
        if spec or conversion:
            return f"conversions and format specs are not supported ({{{name}}} only)"
    return None


def fill_template(template: str, namespace: str, service: str, track: str, domain: str) -> str:
    """The template with its placeholders filled in (call template_error first)."""
    return template.format(namespace=namespace, service=service, track=track, domain=domain)


def _allowed_by_setting(host: str, allowed: Sequence[str]) -> bool:
    """Whether one of the operator's allowed-host entries (host, *.suffix, IP, CIDR) covers `host`."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in allowed:
        entry = entry.strip().lower().rstrip(".")
        if not entry:
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        if entry.startswith("*."):
            if host.endswith(entry[1:]) and len(host) > len(entry) - 1:
                return True
        elif host == entry:
            return True
    return False


def url_error(url: str, allowed: Sequence[str], cluster_domain: str) -> str | None:
    """Why the operator must not call `url`, or None.

    Examples (no allowed entries, domain cluster.local): 'http://prometheus.monitoring.svc:9090' -> None;
    'http://prom.example.com' -> 'host prom.example.com is not cluster-internal ...';
    'http://127.0.0.1:9090' -> refused unless an entry such as '127.0.0.1' or '127.0.0.0/8' allows it.
    """
    if any(c.isspace() for c in url) or "\\" in url:
        return "must not contain spaces or backslashes"
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower().rstrip(".")
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if "@" in parts.netloc:
        return "must not carry user information (user@host)"
    if not host:
        return "has no host"
    internal = (".svc", f".svc.{cluster_domain.strip('.').lower()}")
    if any(host.endswith(suffix) and len(host) > len(suffix) for suffix in internal):
        return None
    if _allowed_by_setting(host, allowed):
        return None
    return (
        f"host {host} is not cluster-internal: the operator calls only *.svc and *.svc.{cluster_domain} "
        "hosts, and those its analysis allowed-hosts setting lists (--analysis-allowed-host)"
    )


def analysis_target_errors(
    probe: ProbeSpec,
    prometheus_address: str,
    namespace: str,
    service: str,
    *,
    default_probe_template: str,
    allowed: Sequence[str],
    cluster_domain: str,
) -> list[str]:
    """Problems of the URLs a release would call, each naming its spec field; [] when all may be called."""
    errors = []
    problem = url_error(prometheus_address, allowed, cluster_domain)
    if problem:
        errors.append(f"spec.analysis.prometheusAddress {prometheus_address!r}: {problem}")
    if probe.enabled:
        template = probe.url or default_probe_template
        problem = template_error(template)
        if problem is None:
            url = fill_template(template, namespace, service, "canary", cluster_domain)
            problem = url_error(url, allowed, cluster_domain)
        if problem:
            errors.append(f"spec.analysis.probe.url {template!r}: {problem}")
    return errors
