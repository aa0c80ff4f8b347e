"""The shipped monitoring artefacts, read as files: every row of docs/operations.md's "metric →
alert when" table has an alert, every alert a severity, a ``for:``, a runbook heading in
docs/operations.md and a firing and a silent unit test; the dashboard follows Grafana's
dashboard JSON model. (promtool runs the rules' tests in tests/integration/test_deploy_rules.py;
tests/integration/test_deploy_metrics.py holds both to a live relay's and inbox's metrics.)"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import promql_parser as promql
import yaml

from tests import deploy

SEVERITIES = {"critical", "warning", "info"}


def _alerts() -> list[dict[str, Any]]:
    return [
        rule for group in deploy.rules()["groups"] for rule in group["rules"] if "alert" in rule
    ]


def _raw_metrics(expr: str, recorded: dict[str, set[str]]) -> set[str]:
    """The workers' metrics ``expr`` reads, through the recording rules it uses."""
    names = deploy.used_metrics([deploy.Query("", expr)])
    return set().union(*(recorded.get(name, {name}) for name in names))


def _table_metrics() -> list[str]:
    text = deploy.OPERATIONS.read_text()
    table = text.split("| metric | alert when |", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\| `(outboxkit_\w+)", table, flags=re.MULTILINE)


def test_every_row_of_the_operations_table_has_an_alert() -> None:
    recorded: dict[str, set[str]] = {}
    for query in deploy.rule_queries():
        if query.records is not None:
            recorded[query.records] = _raw_metrics(query.expr, recorded)
    alerted: dict[str, set[str]] = defaultdict(set)
    for alert in _alerts():
        for metric in _raw_metrics(alert["expr"], recorded):
            alerted[metric.removesuffix("_bucket")].add(alert["alert"])
    table = _table_metrics()
    assert len(table) == 17, table
    assert not [metric for metric in table if not alerted[metric]], dict(alerted)


def test_every_alert_has_a_severity_a_duration_and_a_runbook_heading() -> None:
    text = deploy.OPERATIONS.read_text()
    headings = {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in text.splitlines()
        if line.startswith("#")
    }
    names = [alert["alert"] for alert in _alerts()]
    assert len(names) == len(set(names)), names
    for alert in _alerts():
        name = alert["alert"]
        assert alert["labels"]["severity"] in SEVERITIES, name
        assert "for" in alert, name
        annotations = alert["annotations"]
        assert annotations["summary"], name
        assert annotations["description"], name
        page, _, anchor = annotations["runbook_url"].partition("#")
        assert page == "docs/operations.md", name
        assert anchor == name.lower(), name
        assert anchor in headings, name
        assert f"[{name}](#{anchor})" in text, f"{name} is not in the alerts table"


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not() -> None:
    fired, silent = set(), set()
    for path in deploy.RULES_TESTS:
        tests = yaml.safe_load(path.read_text())
        assert tests["rule_files"] == [deploy.RULES.name]
        for group in tests["tests"]:
            for case in group.get("alert_rule_test", []):
                (fired if case.get("exp_alerts") else silent).add(case["alertname"])
    names = {alert["alert"] for alert in _alerts()}
    assert fired == names, names ^ fired
    assert silent == names, names ^ silent


def test_the_dashboard_follows_grafanas_json_model() -> None:
    board = deploy.dashboard()
    for key in ("uid", "title", "schemaVersion", "panels", "templating", "time", "annotations"):
        assert key in board, key
    assert board["id"] is None, "an exported dashboard has no id: Grafana gives one on import"
    assert isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = list(deploy.panels(board))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    cells: dict[tuple[int, int], str] = {}
    rows = [panel["title"] for panel in panels if panel["type"] == "row"]
    assert rows == ["Relay", "Inbox", "Pipeline"]
    for panel in panels:
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("h", "w", "x", "y")), panel["title"]
        assert grid["w"] > 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
        if panel["type"] in ("row", "text"):
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["description"], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert refs, panel["title"]
        assert len(refs) == len(set(refs)), panel["title"]
    for query in deploy.dashboard_queries():
        promql.parse(query.expr)  # raises if it does not parse
    text = "\n".join(panel.get("description", "") for panel in panels)
    assert "floor" in text, "the latency panel shows Kafka's floor"
    assert "does not export it" in text, "and says the bench does not export it"
