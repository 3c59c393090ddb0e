"""The chart's README is generated from its schema and values (hack/chart_readme.py) and kept current.

Test design: the generator runs in check mode on the repository's chart; then on a copy of the chart whose
schema gains a description, to see that check mode notices. Every value the schema knows is a row.
"""

from __future__ import annotations

import json
import shutil
import sys

import yaml
from chatfleet_platform.common.config import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "hack"))

import chart_readme

CHART = REPO_ROOT / "charts" / "chatfleet-operator"


def test_the_readme_is_current():
    assert chart_readme.main(["--check"]) == 0, (
        "run `make chart-readme` and commit charts/chatfleet-operator/README.md"
    )


def test_a_schema_change_makes_the_readme_stale(tmp_path, monkeypatch):
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    monkeypatch.setattr(chart_readme, "CHART", chart)
    assert chart_readme.main(["--check"]) == 0
    schema = json.loads((chart / "values.schema.json").read_text())
    schema["properties"]["replicaCount"]["description"] = "a new description"
    (chart / "values.schema.json").write_text(json.dumps(schema))
    assert chart_readme.main(["--check"]) == 1
    assert chart_readme.main([]) == 0 and chart_readme.main(["--check"]) == 0
    assert "| `replicaCount` | integer | `1` | a new description |" in (chart / "README.md").read_text()


def test_every_value_is_a_row_with_its_default():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    rows = {path: default for path, _, default, _ in chart_readme.rows(schema, values)}
    assert set(values) <= set(rows)  # every top-level value
    assert rows["rbac.aggregateToDefaultRoles"] == "`true`"
    assert rows["watch.scope"] == '`"cluster"`'
