"""The apply plan: which owned objects to write or delete, from desired vs observed. Pure.

A pass that finds every desired manifest already contained in the observed object plans nothing, so
steady state writes nothing. "Contained" is a subset test: fields the apiserver defaults (or other
controllers add) are ignored; quantity fields compare by value ("0.5" == "500m"); a missing empty or false
field equals an empty or false desired one.

Only fields that hold a Kubernetes quantity are parsed as one (see `is_quantity_field`). Everything else
(labels, annotations, selectors, env values, hashes) compares as a string: a revision hash such as
'90e9577223' is not the number 90 * 10**9577223.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from chatfleet_operator import api

Path = tuple[str, ...]

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")
_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def parse_quantity(value: str) -> Decimal | None:
    """Value of a Kubernetes quantity, e.g. '500m' -> 0.5, '1Gi' -> 1073741824; None if not one."""
    match = _QUANTITY.match(value.strip())
    if not match:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number).scaleb(int(suffix[1:]))
        return Decimal(number) * _SUFFIX[suffix]
    except (ArithmeticError, KeyError, ValueError):  # decimal.Overflow, InvalidOperation: not a quantity
        return None


#: Map keys whose every value is a quantity (container and PVC resources).
_QUANTITY_MAPS = frozenset({"requests", "limits", "capacity", "allocatable", "overhead"})
#: Keys that hold a quantity, with the key of the map they sit in ("" for any).
_QUANTITY_KEYS = frozenset({("", "sizeLimit"), ("target", "value"), ("target", "averageValue")})


def is_quantity_field(path: Path) -> bool:
    """Whether the field at `path` holds a Kubernetes quantity.

    Examples: ('spec', 'template', 'spec', 'containers', 'resources', 'limits', 'memory') -> True;
    ('spec', 'metrics', 'pods', 'target', 'averageValue') -> True; ('metadata', 'labels', 'x') -> False;
    ('spec', 'template', 'spec', 'containers', 'env', 'value') -> False. List items add no path element.
    """
    if len(path) >= 2 and path[-2] in _QUANTITY_MAPS:
        return True
    parent = path[-2] if len(path) >= 2 else ""
    return bool(path) and (("", path[-1]) in _QUANTITY_KEYS or (parent, path[-1]) in _QUANTITY_KEYS)


def _scalar_equal(desired: Any, observed: Any, quantity: bool) -> bool:
    """Equal scalars (an int equals its decimal string), or, in a quantity field, equal quantities."""
    if desired == observed:
        return True
    if isinstance(desired, bool) or isinstance(observed, bool):
        return False
    if isinstance(desired, (str, int)) and isinstance(observed, (str, int)):
        if str(desired) == str(observed):
            return True
        if quantity:
            a, b = parse_quantity(str(desired)), parse_quantity(str(observed))
            return a is not None and a == b
    return False


def _is_empty(value: Any) -> bool:
    """Values the apiserver drops on output (omitempty)."""
    return value is None or value is False or value == 0 or value == "" or value == {} or value == []


def contains(observed: Any, desired: Any, path: Path = ()) -> bool:
    """True when every field of `desired` is present and equal in `observed` (lists: same length).

    `path` is where these values sit in the object (map keys only), so that quantity fields are known.
    """
    if desired is None:
        return True
    if isinstance(desired, Mapping):
        if not isinstance(observed, Mapping):
            return _is_empty(desired) and observed is None
        return all(
            contains(observed[key], value, (*path, str(key))) if key in observed else _is_empty(value)
            for key, value in desired.items()
        )
    if isinstance(desired, Sequence) and not isinstance(desired, str):
        if not isinstance(observed, Sequence) or isinstance(observed, str):
            return _is_empty(desired) and observed is None
        return len(desired) == len(observed) and all(
            contains(o, d, path) for o, d in zip(observed, desired, strict=True)
        )
    if observed is None:
        return _is_empty(desired)
    return _scalar_equal(desired, observed, is_quantity_field(path))


def controlled_by_another(body: Mapping[str, Any]) -> bool:
    """Whether another kind of object controls it, e.g. the HPA KEDA makes (controller: its ScaledObject)."""
    refs = (body.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("controller") and r.get("kind") != api.KIND for r in refs)


def object_key(manifest: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, name) identifying an owned object inside one namespace."""
    return manifest["kind"], manifest["metadata"]["name"]


@dataclass(frozen=True)
class Change:
    """One write: `apply` a desired manifest (server-side apply) or `delete` an object no longer wanted."""

    verb: str
    kind: str
    name: str
    manifest: Mapping[str, Any] | None = None
    why: str = ""


def diff_children(
    desired: Sequence[Mapping[str, Any]],
    observed: Mapping[tuple[str, str], Mapping[str, Any]],
    owned_kinds: Sequence[str] = (),
    owned_components: Sequence[str] = (),
) -> list[Change]:
    """Applies for missing or drifted objects, deletes for observed owned objects not desired.

    Example: desired [Service a], observed {} -> [apply Service a (created)];
    observed {(Service, a): same} -> []; observed {(HorizontalPodAutoscaler, x): ...} with
    owned_kinds=['HorizontalPodAutoscaler'] and no desired HPA -> [delete HorizontalPodAutoscaler x].
    `owned_components`: objects of any kind labelled with one of these components are deletable too.
    """
    changes: list[Change] = []
    wanted = set()
    for manifest in desired:
        key = object_key(manifest)
        wanted.add(key)
        current = observed.get(key)
        if current is None:
            changes.append(Change("apply", key[0], key[1], manifest, "missing"))
        elif not contains(current, manifest):
            changes.append(Change("apply", key[0], key[1], manifest, "drifted"))
    for key in sorted(observed):
        body = observed[key]
        component = ((body.get("metadata") or {}).get("labels") or {}).get(api.LABEL_COMPONENT)
        deletable = key[0] in owned_kinds or (component is not None and component in owned_components)
        if deletable and key not in wanted and not controlled_by_another(body):
            changes.append(Change("delete", key[0], key[1], None, "not desired"))
    return changes
