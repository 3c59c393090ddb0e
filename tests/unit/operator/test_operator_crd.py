"""The CRD offline: names, descriptions everywhere, defaults agree with chatfleet_operator.spec, CEL messages name fields."""

from __future__ import annotations

from typing import Any

import pytest
from chatfleet_operator import api
from chatfleet_operator.spec import ChatbotServiceSpec


def walk(schema: dict[str, Any], path: str = ""):
    """Yield (path, schema) for every property in the schema."""
    for name, sub in (schema.get("properties") or {}).items():
        yield f"{path}.{name}", sub
        yield from walk(sub, f"{path}.{name}")
    if "items" in schema:
        yield from walk(schema["items"], f"{path}[]")


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the API server does it (defaults of absent fields, recursively)."""
    if isinstance(value, dict):
        out = dict(value)
        for name, sub in (schema.get("properties") or {}).items():
            if name not in out and "default" in sub:
                out[name] = sub["default"]
            if name in out:
                out[name] = apply_defaults(sub, out[name])
        return out
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], v) for v in value]
    return value


class TestNames:
    def test_names(self, crd):
        names = crd["spec"]["names"]
        assert crd["spec"]["group"] == api.GROUP
        assert (names["kind"], names["plural"], names["singular"]) == (api.KIND, api.PLURAL, api.SINGULAR)
        assert names["shortNames"] == ["cbs"] and names["categories"] == ["chatfleet"]
        version = crd["spec"]["versions"][0]
        assert version["name"] == api.VERSION and "status" in version["subresources"]

    def test_printer_columns(self, crd):
        columns = [
            c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"] if not c.get("priority")
        ]
        assert columns == ["Ready", "Phase", "Replicas", "GPUs", "Stable", "Canary-Weight", "Age"]


class TestSchema:
    def test_every_spec_field_has_a_description(self, crd_schema):
        spec = crd_schema["properties"]["spec"]
        missing = [path for path, sub in walk(spec, "spec") if not sub.get("description")]
        assert missing == []

    def test_every_rule_message_names_a_field(self, crd_schema):
        rules = []

        def collect(schema: dict[str, Any]) -> None:
            rules.extend(schema.get("x-kubernetes-validations") or [])
            for sub in (schema.get("properties") or {}).values():
                collect(sub)
            if "items" in schema:
                collect(schema["items"])

        collect(crd_schema)
        assert len(rules) >= 15
        for rule in rules:
            assert rule["message"].startswith(("spec.", "metadata.")), rule["message"]

    @pytest.mark.parametrize(
        "spec",
        [
            pytest.param({"model": {"uri": "hf://a/b"}}, id="minimal"),
            pytest.param({"model": {"uri": "hf://a/b"}, "scaling": {"autoscale": {}}}, id="autoscale"),
            pytest.param(
                {"model": {"uri": "hf://a/b"}, "observability": {"tracing": {"endpoint": "http://c:4318"}}},
                id="tracing",
            ),
        ],
    )
    def test_crd_defaults_agree_with_spec_py(self, crd_schema, spec):
        defaulted = apply_defaults(crd_schema["properties"]["spec"], spec)
        assert ChatbotServiceSpec.from_dict(defaulted) == ChatbotServiceSpec.from_dict(spec)
