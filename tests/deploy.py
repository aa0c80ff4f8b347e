"""What the shipped monitoring artefacts (``deploy/``) ask of the workers' metrics: every PromQL
query of the alert rules and of the Grafana dashboard, parsed with promql-parser, and a check
of each against the metric names and labels a scrape showed.

A query is checked as Prometheus would evaluate it: each selector's metric must exist (a
recording rule's output counts, with the labels its aggregation keeps), each label it matches on
must be one of that metric's, each ``by``/``on``/``group_*`` label must reach the aggregation or
match from below it, and each label an alert's annotations (``$labels.topic``) or a panel's
legend (``{{topic}}``) shows must be in the query's result.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser as promql
import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "outboxkit-rules.yaml"
#: promtool's unit tests of the rules: minutes-scale alerts, and the one over days.
RULES_TESTS = (
    DEPLOY / "prometheus" / "outboxkit-rules.test.yaml",
    DEPLOY / "prometheus" / "outboxkit-rules.days.test.yaml",
)
DASHBOARD = DEPLOY / "grafana" / "outboxkit.json"
CHART = DEPLOY / "kubernetes" / "outboxkit"
FULL_VALUES = DEPLOY / "kubernetes" / "values-full.yaml"
OPERATIONS = REPO / "docs" / "operations.md"

#: Labels Prometheus gives every scraped series (its target's), which no worker exports.
TARGET_LABELS = frozenset({"instance", "job"})

#: Grafana's variables, as a value a query may hold in their place.
_GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}

_SHOWN = re.compile(r"\$labels\.(\w+)|\{\{\s*(\w+)\s*\}\}")


@dataclass(frozen=True)
class Query:
    """One PromQL query of an artefact: ``where`` it is, and the labels it ``shows``."""

    where: str
    expr: str
    shows: frozenset[str] = frozenset()
    #: A recording rule's output name.
    records: str | None = None


def rules() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return loaded


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _shown(*texts: str) -> frozenset[str]:
    return frozenset(a or b for text in texts for a, b in _SHOWN.findall(text))


def rule_queries() -> list[Query]:
    """The recording rules first (in order: later ones may use earlier ones), then the alerts."""
    queries = []
    for group in rules()["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                queries.append(
                    Query(f"record {rule['record']}", rule["expr"], records=rule["record"])
                )
            else:
                shown = _shown(*rule.get("annotations", {}).values())
                queries.append(Query(f"alert {rule['alert']}", rule["expr"], shown))
    return queries


def panels(board: Mapping[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Every panel, rows' collapsed panels too."""
    for panel in (board or dashboard())["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries() -> list[Query]:
    """The panels' targets, and the metrics and labels its variables list values of."""
    board = dashboard()
    queries = []
    for panel in panels(board):
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in _GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            where = f"panel {panel['title']!r} {target['refId']}"
            queries.append(Query(where, expr, _shown(target.get("legendFormat", ""))))
    for variable in board["templating"]["list"]:
        found = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable.get("definition", ""))
        if found:
            metric, label = found.groups()
            queries.append(Query(f"variable {variable['name']}", metric, frozenset({label})))
    return queries


def check(queries: list[Query], metrics: Mapping[str, frozenset[str]]) -> list[str]:
    """Problems of ``queries`` against ``metrics`` (sample name → its label names), recording
    rules resolved in order."""
    known = dict(metrics)
    problems: list[str] = []
    for query in queries:
        try:
            expr = promql.parse(query.expr)
        except Exception as exc:  # promql-parser raises its own ValueError-like errors
            problems.append(f"{query.where}: does not parse: {exc}")
            continue
        result = _labels(expr, known, problems, query.where)
        for label in sorted(query.shows - result):
            problems.append(f"{query.where}: shows label {label!r}, which its result lacks")
        if query.records is not None:
            known[query.records] = result
    return problems


def used_metrics(queries: list[Query]) -> set[str]:
    """The metric names ``queries`` select (recording rules' outputs included)."""
    names: set[str] = set()

    def visit(node: Any) -> bool:
        if isinstance(node, promql.VectorSelector) and node.name:
            names.add(node.name)
        return True

    for query in queries:
        promql.walk(promql.parse(query.expr), visit)
    return names


def _labels(
    node: Any, known: Mapping[str, frozenset[str]], problems: list[str], where: str
) -> frozenset[str]:
    """The labels ``node``'s result carries; what it uses that does not exist goes to
    ``problems``."""
    match node:
        case promql.VectorSelector():
            have = known.get(node.name or "")
            if have is None:
                problems.append(f"{where}: no metric {node.name!r}")
                return frozenset()
            for matcher in node.matchers.matchers:
                if matcher.name != "__name__" and matcher.name not in have:
                    problems.append(f"{where}: {node.name} has no label {matcher.name!r}")
            return have
        case promql.MatrixSelector():
            return _labels(node.vector_selector, known, problems, where)
        case promql.SubqueryExpr() | promql.ParenExpr() | promql.UnaryExpr():
            return _labels(node.expr, known, problems, where)
        case promql.Call():
            inner = [
                _labels(arg, known, problems, where)
                for arg in node.args
                if not isinstance(arg, promql.NumberLiteral | promql.StringLiteral)
            ]
            have = frozenset().union(*inner)
            return have - {"le"} if node.func.name == "histogram_quantile" else have
        case promql.AggregateExpr():
            have = _labels(node.expr, known, problems, where)
            modifier = node.modifier
            if modifier is None:
                return frozenset()
            grouping = frozenset(modifier.labels)
            for label in sorted(grouping - have):
                problems.append(f"{where}: aggregates by {label!r}, which its input lacks")
            if modifier.type == promql.AggModifierType.By:
                return grouping
            return have - grouping
        case promql.BinaryExpr():
            left = _labels(node.lhs, known, problems, where)
            right = _labels(node.rhs, known, problems, where)
            matching = node.modifier.matching if node.modifier is not None else None
            if matching is not None:
                for label in sorted(frozenset(matching.labels) - (left | right)):
                    problems.append(f"{where}: matches on {label!r}, which neither side has")
            if isinstance(node.lhs, promql.NumberLiteral):
                return right
            if isinstance(node.rhs, promql.NumberLiteral):
                return left
            return left | right
        case _:
            return frozenset()
