"""The Gateway API data plane's pieces: Traefik's flags, the Gateway, the pinned CRDs, the TraefikService."""

import ipaddress
import json

import pytest
import yaml
from chatfleet_platform.addons import gatewayapi, traefikcrd
from chatfleet_platform.addons.gateway import (
    CONTROLLER_NAME,
    SHARED_NAMESPACE,
    Gateway,
    gateway_class,
    gateway_manifest,
    server_errors,
    traefik_args,
)
from chatfleet_platform.common.config import PlatformError, go_module_dir, read_versions
from chatfleet_platform.servers import hostbackends

pytestmark = pytest.mark.harness


def test_traefik_listens_on_loopback_only_and_reports_nothing():
    args = traefik_args("traefik", 18080)
    addresses = [a for a in args if ".address=" in a]
    assert addresses == ["--entryPoints.web.address=127.0.0.1:18080"]
    assert "--global.sendAnonymousUsage=false" in args and "--global.checkNewVersion=false" in args
    # a dashboard, API, ping or metrics would open a second entryPoint (":8080", every address)
    assert not [a for a in args if a.split("=")[0].split(".")[0] in ("--api", "--ping", "--metrics")]


def test_traefik_runs_the_crd_provider_beside_the_gateway_provider_allowing_empty_services_only():
    args = traefik_args("traefik", 18080)
    providers = sorted(a for a in args if a.startswith("--providers."))
    assert providers == [
        "--providers.kubernetescrd.allowEmptyServices=true",  # an empty mirror costs nothing
        "--providers.kubernetescrd.disableClusterScopeResources=true",  # no Node watch
        "--providers.kubernetescrd=true",
        "--providers.kubernetesgateway.statusaddress.ip=127.0.0.1",
        "--providers.kubernetesgateway=true",
    ]
    # cross-namespace references and ExternalName Services: refused, as by default
    assert [a for a in args if "allow" in a.lower()] == ["--providers.kubernetescrd.allowEmptyServices=true"]


def test_traefik_forwards_with_its_fast_proxy():
    # Go's ReverseProxy (Traefik's default) cuts a streamed answer to a POST now and then (Go issue 40747)
    assert "--experimental.fastProxy=true" in traefik_args("traefik", 18080)


def test_the_gateway_listener_port_is_the_entrypoint_port():
    gw = gateway_manifest("ns", 18080)
    (listener,) = gw["spec"]["listeners"]
    assert (listener["port"], listener["protocol"]) == (18080, "HTTP")
    assert listener["allowedRoutes"]["namespaces"]["from"] == "All"
    assert gw["metadata"] == {"name": "chatfleet", "namespace": "ns"}
    assert gateway_class()["spec"]["controllerName"] == CONTROLLER_NAME == "traefik.io/gateway-controller"


def test_gateway_api_is_new_enough_for_traefik():
    # Traefik 3.6 lists BackendTLSPolicy v1: v1.3.0's standard channel has no such CRD
    major, minor = (int(x) for x in gatewayapi.GATEWAY_API_VERSION.lstrip("v").split(".")[:2])
    assert (major, minor) >= (1, 4)
    assert "backendtlspolicies.gateway.networking.k8s.io" in gatewayapi.CRD_NAMES


def test_crd_names_are_the_whole_standard_channel():
    folder = gatewayapi.crd_dir()
    names = {
        p.name.removeprefix("gateway.networking.k8s.io_").removesuffix(".yaml") for p in folder.glob("*.yaml")
    }
    assert {f"{n}.gateway.networking.k8s.io" for n in names} == set(gatewayapi.CRD_NAMES)


class TestTraefikCRDs:
    def test_the_crd_file_of_the_pinned_module_holds_exactly_crd_names(self):
        path = traefikcrd.crd_file()
        assert f"@{traefikcrd.module_version()}" in str(path)
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        assert {d["kind"] for d in docs} == {"CustomResourceDefinition"}
        assert sorted(d["metadata"]["name"] for d in docs) == sorted(traefikcrd.CRD_NAMES)

    def test_without_go_the_fetch_fails_saying_so(self, monkeypatch):
        monkeypatch.setenv("PATH", "")
        with pytest.raises(PlatformError, match="go is missing"):
            go_module_dir(traefikcrd.MODULE, traefikcrd.module_version())

    def test_the_module_version_is_the_one_the_platform_builds(self):
        assert traefikcrd.module_version() == "v" + read_versions()["TRAEFIK_VERSION"]

    def test_traefikservice_schema_has_the_mirroring_fields_the_builder_writes(self):
        docs = yaml.safe_load_all(traefikcrd.crd_file().read_text())
        (crd,) = [d for d in docs if d and d["metadata"]["name"] == "traefikservices.traefik.io"]
        (version,) = crd["spec"]["versions"]
        assert version["name"] == traefikcrd.API_VERSION.split("/")[1]
        mirroring = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["mirroring"]
        fields = mirroring["properties"]
        assert {"name", "port", "mirrors", "maxBodySize", "mirrorBody"} <= set(fields)
        assert {"name", "port", "percent"} <= set(fields["mirrors"]["items"]["properties"])


class TestMirroringService:
    def test_main_service_and_one_mirror_with_a_percentage(self):
        svc = traefikcrd.mirroring_service(
            "bot-mirror", "ns", main=("bot", 8080), mirrors=[("bot-shadow", 8081, 25)]
        )
        assert svc == {
            "apiVersion": "traefik.io/v1alpha1",
            "kind": "TraefikService",
            "metadata": {"name": "bot-mirror", "namespace": "ns"},
            "spec": {
                "mirroring": {
                    "name": "bot",
                    "port": 8080,
                    "mirrors": [{"name": "bot-shadow", "port": 8081, "percent": 25}],
                }
            },
        }

    @pytest.mark.parametrize(
        ("max_body_size", "expected"),
        [
            pytest.param(None, None, id="traefik-default-left-alone"),
            pytest.param(1 << 20, 1 << 20, id="one-mebibyte"),
            pytest.param(-1, -1, id="unbounded"),
        ],
    )
    def test_max_body_size_only_when_given(self, max_body_size, expected):
        svc = traefikcrd.mirroring_service(
            "m", "ns", main=("bot", 8080), mirrors=[("s", 8081, 100)], max_body_size=max_body_size
        )
        assert svc["spec"]["mirroring"].get("maxBodySize") == expected

    def test_the_route_refers_to_it_without_a_port(self):
        ref = traefikcrd.traefik_service_ref("bot-mirror")
        assert ref == {"group": "traefik.io", "kind": "TraefikService", "name": "bot-mirror", "weight": 100}


class TestHostBackends:
    def test_the_slice_belongs_to_the_service_and_names_its_port(self):
        svc = hostbackends.selectorless_service("bot-shadow", "ns", 8081, "shadow")
        eps = hostbackends.endpoint_slice("bot-shadow", "ns", "10.246.0.1", 41234, "shadow")
        assert "selector" not in svc["spec"]
        assert eps["metadata"]["labels"]["kubernetes.io/service-name"] == svc["metadata"]["name"]
        assert eps["metadata"]["namespace"] == svc["metadata"]["namespace"] == "ns"
        assert eps["ports"] == [{"name": "shadow", "port": 41234, "protocol": "TCP"}]
        assert svc["spec"]["ports"] == [{"name": "shadow", "port": 8081, "protocol": "TCP"}]
        (endpoint,) = eps["endpoints"]
        assert endpoint == {"addresses": ["10.246.0.1"], "conditions": {"ready": True, "serving": True}}

    def test_host_addresses_stay_clear_of_the_platforms_ranges_and_of_loopback(self):
        taken = ["10.96.0.0/16", "10.244.0.0/16", "10.245.0.0/16", "127.0.0.0/8", "169.254.0.0/16"]
        for net in taken:
            assert not hostbackends.HOST_ADDRESS_RANGE.overlaps(ipaddress.ip_network(net)), net


def test_the_placeholder_crd_is_of_the_group_and_approved_for_k8s_io_groups():
    from chatfleet_platform.cluster.cluster import placeholder_crd

    crd = placeholder_crd("gateway.networking.k8s.io")
    assert crd["metadata"]["name"] == "chatfleetplaceholders.gateway.networking.k8s.io"
    assert crd["spec"]["group"] == "gateway.networking.k8s.io"
    assert crd["metadata"]["annotations"]["api-approved.kubernetes.io"].startswith("unapproved")


def test_a_route_attaches_to_the_shared_gateway_for_one_hostname(tmp_path):
    class FakeCluster:
        workdir = tmp_path

    rules = [{"backendRefs": [{"name": "bot", "port": 8080}]}]
    route = Gateway(FakeCluster()).route("bot", "ns", "bot.example", rules)
    assert route["metadata"] == {"name": "bot", "namespace": "ns"}
    assert route["spec"] == {
        "parentRefs": [{"name": "chatfleet", "namespace": SHARED_NAMESPACE}],
        "hostnames": ["bot.example"],
        "rules": rules,
    }


def test_server_errors_name_the_pod_and_tell_traefiks_own_answers_from_none(tmp_path):
    """A 502 that Traefik's proxy wrote for a failed exchange carries the pod's address; a 503 with no
    endpoint has none (origin 0); 2xx and 4xx answers and lines that are not JSON are not counted."""
    log = tmp_path / "access.json"
    rows = [
        {
            "DownstreamStatus": 200,
            "OriginStatus": 200,
            "ServiceName": "ns-bot-8080@kubernetesgateway",
            "ServiceAddr": "10.245.0.41:8080",
        },
        {
            "DownstreamStatus": 502,
            "OriginStatus": 502,
            "ServiceName": "ns-bot-8080@kubernetesgateway",
            "ServiceAddr": "10.245.0.41:8080",
        },
        {
            "DownstreamStatus": 502,
            "OriginStatus": 502,
            "ServiceName": "ns-bot-8080@kubernetesgateway",
            "ServiceAddr": "10.245.0.41:8080",
        },
        {"DownstreamStatus": 503, "OriginStatus": 0, "ServiceName": "ns-bot-canary-8080@kubernetesgateway"},
        {
            "DownstreamStatus": 429,
            "OriginStatus": 429,
            "ServiceName": "ns-bot-8080@kubernetesgateway",
            "ServiceAddr": "10.245.0.39:8080",
        },
    ]
    log.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    assert server_errors(log) == {
        "502 from ns-bot-8080@kubernetesgateway at 10.245.0.41:8080 (origin 502)": 2,
        "503 from ns-bot-canary-8080@kubernetesgateway at - (origin 0)": 1,
    }
    assert server_errors(tmp_path / "none.json") == {}
