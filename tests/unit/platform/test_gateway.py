"""The Gateway API data plane's pieces: Traefik's flags, the Gateway, the pinned CRDs."""

import pytest
from chatfleet_platform import gatewayapi
from chatfleet_platform.gateway import CONTROLLER_NAME, gateway_class, gateway_manifest, traefik_args

pytestmark = pytest.mark.harness


def test_traefik_listens_on_loopback_only_and_reports_nothing():
    args = traefik_args("traefik", 18080)
    addresses = [a for a in args if ".address=" in a]
    assert addresses == ["--entryPoints.web.address=127.0.0.1:18080"]
    assert "--global.sendAnonymousUsage=false" in args and "--global.checkNewVersion=false" in args
    # a dashboard, API, ping or metrics would open a second entryPoint (":8080", every address)
    assert not [a for a in args if a.split("=")[0].split(".")[0] in ("--api", "--ping", "--metrics")]


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
