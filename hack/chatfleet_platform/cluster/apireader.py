"""Plain reads without a kubectl process: `kubectl get ... -o json|name` answered over a kept connection.

The tests poll the API through `Cluster.kubectl("get", ...)` every second or two, and each call was a new
kubectl process: a Go binary's start, the kubeconfig, the discovery cache, a TLS handshake (measured:
about 90 ms of CPU a read, against about 1.3 ms here) on a 2-core machine the suite keeps busy. `Cluster.kubectl` hands the calls this module understands to
an `ApiReader`, which answers them as kubectl does -- the same JSON (kubectl's key order and escaping, no
managedFields, a `List` with each item's kind and apiVersion), the same `-o name` lines, the same NotFound
line and `--ignore-not-found` -- over one HTTPS connection per thread, kept open. Anything else (other
verbs, other output formats, flags it does not know, errors other than NotFound) goes to kubectl.

`parse` and the printers are pure; `ApiReader` does the HTTP.
"""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
import threading
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Aggregated discovery (one answer per root: every group, version and resource).
DISCOVERY_ACCEPT = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


@dataclass(frozen=True)
class Get:
    """One `kubectl get` this module can answer: resource types, names, where, how printed."""

    resources: tuple[str, ...]
    names: tuple[str, ...]
    namespace: str | None  # None: the kubeconfig's namespace
    all_namespaces: bool
    selector: str | None
    output: str  # "json" or "name"
    ignore_not_found: bool

    @property
    def single(self) -> bool:
        """One object named: kubectl prints it bare, not in a List."""
        return len(self.resources) == 1 and len(self.names) == 1


def parse(args: Sequence[str], namespace: str | None = None) -> Get | None:
    """The `Get` of kubectl's arguments (`namespace`: Cluster.kubectl's own), or None for anything else."""
    if not args or args[0] != "get":
        return None
    flags: dict[str, str] = {}
    positional: list[str] = []
    valued = {"-o": "output", "--output": "output", "-l": "selector", "--selector": "selector"}
    valued |= {"-n": "namespace", "--namespace": "namespace"}
    i = 1
    while i < len(args):
        arg = args[i]
        if arg in valued:
            if i + 1 >= len(args):
                return None
            flags[valued[arg]] = args[i + 1]
            i += 2
            continue
        key, eq, value = arg.partition("=")
        if eq and key in valued:
            flags[valued[key]] = value
        elif arg.startswith("-o") and len(arg) > 2 and not arg.startswith("--"):
            flags["output"] = arg[2:]
        elif arg in ("--ignore-not-found", "--ignore-not-found=true"):
            flags["ignore_not_found"] = "true"
        elif arg in ("-A", "--all-namespaces", "--all-namespaces=true"):
            flags["all_namespaces"] = "true"
        elif arg.startswith("-"):
            return None  # a flag this module does not know: kubectl's
        else:
            positional.append(arg)
        i += 1
    if flags.get("output") not in ("json", "name") or not positional:
        return None
    if "/" in positional[0]:  # TYPE/NAME ...
        pairs = [p.split("/", 1) for p in positional]
        if any(len(p) != 2 or not p[0] or not p[1] for p in pairs) or len({p[0] for p in pairs}) != 1:
            return None  # several kinds by TYPE/NAME: kubectl's
        resources, names = (pairs[0][0],), tuple(p[1] for p in pairs)
    else:
        resources, names = tuple(positional[0].split(",")), tuple(positional[1:])
        if any("/" in n for n in names) or not all(resources):
            return None
    if names and len(resources) > 1:
        return None
    all_namespaces = "all_namespaces" in flags
    if all_namespaces and names:
        return None
    return Get(
        resources=resources,
        names=names,
        namespace=flags.get("namespace") or namespace,
        all_namespaces=all_namespaces,
        selector=flags.get("selector"),
        output=flags["output"],
        ignore_not_found="ignore_not_found" in flags,
    )


@dataclass(frozen=True)
class Resource:
    """A resource type as discovery names it."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None, name: str | None = None) -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        where = f"/namespaces/{namespace}" if self.namespaced and namespace else ""
        return f"{root}{where}/{self.plural}" + (f"/{urllib.parse.quote(name, safe='')}" if name else "")

    def name_of(self, name: str) -> str:
        """`-o name`'s line: kind.group/name (the core group's without the group)."""
        kind = self.kind.lower()
        return f"{kind}.{self.group}/{name}" if self.group else f"{kind}/{name}"


def resources_by_name(groups: Iterable[Mapping[str, Any]]) -> dict[str, Resource]:
    """Every name kubectl resolves to a resource (plural, singular, short names, kind, each also with
    `.group` and `.version.group`), from aggregated discovery's groups in their priority order: the
    first group to claim a bare name keeps it, as kubectl's mapper does. The preferred (first) version
    answers bare names; each version answers its own `.version.group`."""
    out: dict[str, Resource] = {}
    for group in groups:
        gname = (group.get("metadata") or {}).get("name") or ""
        for rank, version in enumerate(group.get("versions") or []):
            for r in version.get("resources") or []:
                kind = (r.get("responseKind") or {}).get("kind") or ""
                plural = r.get("resource") or ""
                if not plural or not kind:
                    continue
                res = Resource(gname, version["version"], plural, kind, r.get("scope") == "Namespaced")
                names = {plural, r.get("singularResource") or "", kind.lower(), *(r.get("shortNames") or [])}
                names.discard("")
                for n in names:
                    out.setdefault(f"{n}.{res.version}.{gname}" if gname else f"{n}.{res.version}", res)
                    if rank == 0:
                        out.setdefault(n, res)
                        if gname:
                            out.setdefault(f"{n}.{gname}", res)
    return out


def go_json(obj: Any) -> str:
    """JSON as kubectl prints it (Go's MarshalIndent of a map: keys sorted, 4 spaces, <, >, & escaped)."""
    text = json.dumps(obj, indent=4, sort_keys=True, ensure_ascii=False)
    for char, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e")):
        text = text.replace(char, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029") + "\n"


def shown(obj: Mapping[str, Any], resource: Resource) -> dict[str, Any]:
    """An object as kubectl shows it: no managedFields; kind and apiVersion set (a list's items lack them)."""
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    meta.pop("managedFields", None)
    out["metadata"] = meta
    out.setdefault("kind", resource.kind)
    out.setdefault("apiVersion", resource.api_version)
    return out


def printed(get: Get, found: Sequence[tuple[Resource, Mapping[str, Any]]]) -> str:
    """kubectl's stdout for `get` having found `found` (in kubectl's order)."""
    if get.output == "name":
        return "".join(f"{r.name_of(o['metadata']['name'])}\n" for r, o in found)
    if get.single and found:
        return go_json(shown(found[0][1], found[0][0]))
    items = [shown(o, r) for r, o in found]
    return go_json({"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}})


class Unanswered(Exception):
    """The reader cannot answer this call as kubectl would: kubectl's turn."""


class ApiReader:
    """`kubectl get` of JSON and names over HTTPS, one kept connection per thread (mutual TLS with the
    admin identity kubectl uses)."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext, default_namespace: str = "default"):
        self.host, self.port, self.context = host, port, context
        self.default_namespace = default_namespace
        self._local = threading.local()
        self._resources: dict[str, Resource] | None = None

    # ---- HTTP --------------------------------------------------------------------------------------
    def _request(self, path: str, timeout: float, accept: str = "application/json") -> tuple[int, Any]:
        for attempt in (0, 1):  # a kept connection the server closed: open another once
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = http.client.HTTPSConnection(
                    self.host, self.port, context=self.context, timeout=timeout
                )
                self._local.conn = conn
            conn.timeout = timeout
            try:
                conn.request("GET", path, headers={"Accept": accept})
                resp = conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise Unanswered(f"GET {path}: no answer") from None
                continue
            try:
                return resp.status, json.loads(body)
            except ValueError:
                raise Unanswered(f"GET {path}: {resp.status}, not JSON") from None
        raise AssertionError("unreachable")

    def discover(self, timeout: float = 30) -> dict[str, Resource]:
        groups: list[Mapping[str, Any]] = []
        for root in ("/api", "/apis"):  # the core group first, as kubectl ranks it
            status, doc = self._request(root, timeout, DISCOVERY_ACCEPT)
            if status != 200 or doc.get("kind") != "APIGroupDiscoveryList":
                raise Unanswered(f"aggregated discovery at {root}: {status}")
            groups.extend(doc.get("items") or [])
        found = self._resources = resources_by_name(groups)  # one assignment: a thread sees either table
        return found

    def resource(self, name: str, timeout: float) -> Resource:
        known = self._resources if self._resources is not None else self.discover(timeout)
        if name not in known:
            known = self.discover(timeout)  # a CRD installed since the last discovery
        if name not in known:
            raise Unanswered(f"no resource type {name!r}")  # kubectl says so in its own words
        return known[name]

    # ---- kubectl get -------------------------------------------------------------------------------
    def get(self, get: Get, argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """kubectl's answer to `get` (argv: what kubectl would have run, for the CompletedProcess)."""
        namespace = None if get.all_namespaces else (get.namespace or self.default_namespace)
        found: list[tuple[Resource, Mapping[str, Any]]] = []
        errors: list[str] = []
        query = f"?labelSelector={urllib.parse.quote(get.selector)}" if get.selector else ""
        for token in get.resources:
            res = self.resource(token, timeout)
            if not get.names:
                status, doc = self._request(res.path(namespace) + query, timeout)
                if status != 200:
                    raise Unanswered(f"list {token}: {status}")
                found.extend((res, item) for item in doc.get("items") or [])
                continue
            for name in get.names:
                status, doc = self._request(res.path(namespace, name), timeout)
                if status == 200:
                    found.append((res, doc))
                elif (
                    status == 404 and (doc.get("details") or {}).get("name") == name
                ):  # the object, not the type
                    if not get.ignore_not_found:
                        errors.append(f"Error from server (NotFound): {doc.get('message')}\n")
                else:
                    raise Unanswered(f"get {token}/{name}: {status}")
        # kubectl: a single object named and not found prints nothing; nothing found with
        # --ignore-not-found prints nothing; otherwise what was found (an empty List too), errors beside it
        quiet = (errors and get.single) or (not found and get.ignore_not_found)
        out = "" if quiet else printed(get, found)
        return subprocess.CompletedProcess(list(argv), 1 if errors else 0, out, "".join(errors))
