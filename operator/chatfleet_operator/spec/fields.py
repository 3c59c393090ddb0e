"""What every part of the spec parser shares: reading a section or a value with its default, and the
defaults a spec parsed on its own falls back to."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chatfleet_operator.defaults import ClusterDefaults

#: What a spec parsed on its own (not the pass's effective spec, chatfleet_operator.defaults) falls back to.
DEFAULT_IMAGE = ClusterDefaults.runtime_image
DEFAULT_FALLBACK_TEXT = "Sorry, I cannot answer right now. Please try again in a moment."
DEFAULT_PROMETHEUS = ClusterDefaults.prometheus_address


def sub_mapping(d: Mapping[str, Any] | None, key: str) -> Mapping[str, Any]:
    """Sub-mapping of `d` at `key`, empty when absent or null."""
    value = (d or {}).get(key)
    return value if isinstance(value, Mapping) else {}


def field_value(d: Mapping[str, Any], key: str, default: Any) -> Any:
    """Value at `key`, or `default` when absent or null."""
    value = d.get(key)
    return default if value is None else value


def optional_float(d: Mapping[str, Any], key: str) -> float | None:
    """Float at `key`, None when absent."""
    value = d.get(key)
    return None if value is None else float(value)
