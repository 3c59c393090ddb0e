"""Whether the parent Gateway serves a canary's HTTPRoute: the Gateways' word in the route's status. Pure.

Gateway API has each Gateway controller write, per parentRef of a route it manages (status.parents[]),
`Accepted` (the Gateway attached the route: a listener allows it, its hostnames match) and `ResolvedRefs`
(every backendRef resolves to a Service it may use). The operator reads them for the Gateway its routes
name (--gateway, --gateway-namespace) into:
- the ChatbotService's condition `RouteServed`: True once that Gateway accepted the route with its
  backends resolved; False with the Gateway's own reason and message when it refuses the route or cannot
  resolve a backend (a Warning event follows from the old -> new difference, converge/status.py);
  Unknown while no controller has answered for that Gateway -- a route just written, or a Gateway that
  does not exist or whose GatewayClass has no controller (then no one ever answers);
- the release (canary/, planner.py): while it is False no user reaches the canary through the
  Gateway (a refused route carries no one; an unresolved backend's share is answered with errors), so a
  canary step neither advances nor counts its pause, and a passing measurement (the probe's traffic
  alone) is no pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from chatfleet_operator import api
from chatfleet_operator.analysis.assess import INCONCLUSIVE, SUCCESSFUL, Measurement
from chatfleet_operator.builders.inferencepool import picker_name, pool_name
from chatfleet_operator.context import PassContext
from chatfleet_operator.converge.facts import get_condition, route_parents
from chatfleet_operator.release.traffic import POOL_BACKENDS

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"
#: Longest part of a Gateway's message put into the condition's.
MESSAGE_LIMIT = 1000


@dataclass(frozen=True)
class RouteState:
    """The parent Gateway's word on the route, as condition RouteServed says it."""

    status: str
    """True, False or Unknown."""
    reason: str
    message: str

    @property
    def refused(self) -> bool:
        """The Gateway refuses the route or cannot resolve a backend: users reach the canary through it no more."""
        return self.status == FALSE

    def condition(self, generation: int) -> dict[str, Any]:
        """The RouteServed condition (no timestamp)."""
        return {
            "type": api.COND_ROUTE_SERVED,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "observedGeneration": generation,
        }


def _detail(message: str) -> str:
    """A Gateway's message, bounded; '' when it gave none."""
    return f": {message[:MESSAGE_LIMIT]}" if message else ""


def route_state(
    route: Mapping[str, Any] | None,
    route_name: str,
    gateway_namespace: str,
    gateway_name: str,
    kind: str = "HTTPRoute",
) -> RouteState:
    """RouteServed of HTTPRoute `route_name` (its observed body, None before it exists) on one Gateway.

    Only status.parents entries for that Gateway count (one per listener section or controller); one
    False outranks the others. e.g. Accepted False NotAllowedByListeners "no listener allows the route"
    -> False, NotAllowedByListeners, "Gateway shop/chatfleet does not accept HTTPRoute bot: no listener
    allows the route"; Accepted True with ResolvedRefs False BackendNotFound -> False, BackendNotFound;
    Accepted True -> True, Accepted; no entry for that Gateway (no status yet) -> Unknown, Pending.
    An InferencePool's status.parents has the same shape (`kind` names it in the messages).
    """
    gateway = f"{gateway_namespace}/{gateway_name}"
    if route is None:
        return RouteState(UNKNOWN, api.Reason.ROUTE_PENDING, f"{kind} {route_name} is not written yet")
    mine = [p for p in route_parents(route) if (p.namespace, p.name) == (gateway_namespace, gateway_name)]
    for p in mine:
        if p.accepted.status == FALSE:
            return RouteState(
                FALSE,
                p.accepted.reason or api.Reason.ROUTE_NOT_ACCEPTED,
                f"Gateway {gateway} does not accept {kind} {route_name}{_detail(p.accepted.message)}",
            )
    for p in mine:
        if p.resolved_refs.status == FALSE:
            return RouteState(
                FALSE,
                p.resolved_refs.reason or api.Reason.REFS_NOT_RESOLVED,
                f"Gateway {gateway} cannot resolve the backends of {kind} {route_name}"
                f"{_detail(p.resolved_refs.message)}",
            )
    if any(p.accepted.status == TRUE for p in mine):
        return RouteState(TRUE, api.Reason.ROUTE_ACCEPTED, f"Gateway {gateway} serves {kind} {route_name}")
    answered = next((p.accepted for p in mine if p.accepted.status), None)
    if answered is not None:  # Accepted Unknown (e.g. Pending: the Gateway has not decided yet)
        return RouteState(
            UNKNOWN,
            answered.reason or api.Reason.ROUTE_PENDING,
            f"Gateway {gateway} has not accepted {kind} {route_name} yet{_detail(answered.message)}",
        )
    return RouteState(
        UNKNOWN,
        api.Reason.ROUTE_PENDING,
        f"No controller of Gateway {gateway} has answered for {kind} {route_name} yet: "
        "check that the Gateway exists and that its GatewayClass has a controller",
    )


def observed_route(ctx: PassContext, route: Mapping[str, Any] | None) -> RouteState | None:
    """RouteServed of the ChatbotService's HTTPRoute as `route` shows it; None where the pass writes no route
    (`ctx.routed`: the strategy's answer)."""
    if not ctx.routed:
        return None
    return _gateways_word(ctx, route, ctx.ref.name)


def _gateways_word(
    ctx: PassContext, body: Mapping[str, Any] | None, name: str, kind: str = "HTTPRoute"
) -> RouteState:
    """route_state of one of this ChatbotService's objects on the Gateway its routes name (--gateway,
    --gateway-namespace; no namespace: the object's own)."""
    release = ctx.settings.release
    gateway_namespace = release.gateway_namespace or ctx.ref.namespace
    return route_state(body, name, gateway_namespace, release.gateway_name, kind)


def routing_status(
    ctx: PassContext, children: Mapping[tuple[str, str], Mapping[str, Any]]
) -> dict[str, Any] | None:
    """status.routing where an HTTPRoute carries the traffic (`ctx.routed`), else None: the route's backends
    and, for InferencePools, the Gateway's word on each pool (its status.parents, as for the route). e.g.
    {"backends": "InferencePool", "pools": [{"name": "bot", "status": "True", "reason": "Accepted",
    "message": "Gateway shop/chatfleet serves InferencePool bot"}, {"name": "bot-canary", ...}],
    "picker": {"ready": True}}."""
    if not ctx.routed:
        return None
    if ctx.backends != POOL_BACKENDS:
        return {"backends": ctx.backends}
    pools = []
    for track in (api.TRACK_STABLE, api.TRACK_CANARY):
        name = pool_name(ctx.ref, track)
        state = _gateways_word(ctx, children.get(("InferencePool", name)), name, "InferencePool")
        pools.append({"name": name, "status": state.status, "reason": state.reason, "message": state.message})
    return {
        "backends": ctx.backends,
        "pools": pools,
        "picker": picker_state(children.get(("Deployment", picker_name(ctx.ref)))),
    }


def picker_state(deployment: Mapping[str, Any] | None) -> dict[str, Any]:
    """status.routing.picker: whether the endpoint picker is Ready and, when its pods cannot be created
    (no ServiceAccount for it in the namespace, a quota), the Deployment's ReplicaFailure message.
    e.g. {"ready": False, "message": "pods \"bot-picker-...\" is forbidden: error looking up service
    account bots/chatfleet-picker: serviceaccount \"chatfleet-picker\" not found"}."""
    status = (deployment or {}).get("status") or {}
    state: dict[str, Any] = {"ready": int(status.get("readyReplicas") or 0) > 0}
    if deployment is None:
        state["message"] = "the picker's Deployment is not written yet"
    failure = get_condition(status, "ReplicaFailure") or {}
    if failure.get("status") == TRUE:
        state["message"] = str(failure.get("message") or failure.get("reason") or "")[:MESSAGE_LIMIT]
    return state


def route_gated(m: Measurement, route: RouteState | None) -> Measurement:
    """A measurement as the release counts it, given the route: never a pass while the Gateway refuses it.

    Passing figures then come from the probe's traffic alone (no user reaches the canary through the
    Gateway): Successful -> Inconclusive, saying so. An Inconclusive one says why the canary may have no
    traffic (the route refused, or no Gateway has answered). Failed and Error ones count as they are.
    e.g. Successful "error rate 0.1% <= 1%", route False -> Inconclusive "error rate 0.1% <= 1%; not a
    pass: the route is not served (NotAllowedByListeners: Gateway shop/chatfleet does not accept
    HTTPRoute bot: ...)".
    """
    if route is None or route.status == TRUE:
        return m
    if m.verdict == SUCCESSFUL and route.refused:
        return replace(m, verdict=INCONCLUSIVE, message=f"{m.message}; not a pass: {not_served(route)}")
    if m.verdict == INCONCLUSIVE:
        return replace(m, message=f"{m.message} ({not_served(route)})")
    return m


def not_served(route: RouteState) -> str:
    """What the release says of a route that is not served. e.g. 'the route is not served (Gateway ...)'."""
    what = "not served" if route.refused else "not known to be served yet"
    return f"the route is {what} ({route.reason}: {route.message})"
