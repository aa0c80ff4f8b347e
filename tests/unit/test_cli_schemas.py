"""``outboxkit schemas export`` and ``check`` (#40): the files they write, the exit codes (0
compatible, 1 a breaking change, 2 a registry or directory that cannot be read) and what they
print; and the pytest helper that runs the same check."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from outboxkit.cli import app
from outboxkit.cli.schemas import Mode
from outboxkit.schemas import EventRegistry
from outboxkit.schemas.compat import CompatibilityMode, Rule
from outboxkit.testing import assert_compatible as exported_helper
from outboxkit.testing.schemas import assert_compatible

runner = CliRunner()
WriteModule = Callable[[str], str]

V1 = """
from outboxkit.schemas import Event, EventRegistry

registry = EventRegistry()


@registry.register
class OrderPlaced(Event, type="shop.order_placed", topic="shop.orders", key_field="order_id"):
    order_id: str
    color: Literal["red", "blue"] = "red"
"""
#: Version 2 added beside version 1: compatible.
V2_ADDED = (
    V1
    + """

@registry.register
class OrderPlacedV2(Event, type="shop.order_placed", version=2, topic="shop.orders",
                   key_field="order_id"):
    order_id: str
    total: int = 0
"""
)
#: Version 1 with a required field: breaks BACKWARD.
REQUIRED_ADDED = V1 + "    coupon: str\n"
#: Version 1's enum gains a value: breaks FORWARD only.
ENUM_ADDED = V1.replace('Literal["red", "blue"]', 'Literal["red", "blue", "green"]')


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> WriteModule:
    """Write a module of events under a fresh name, importable by the command."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(source: str) -> str:
        name = f"events_{uuid.uuid4().hex[:8]}"
        header = "from typing import Literal\n"
        (tmp_path / f"{name}.py").write_text(header + textwrap.dedent(source))
        return name

    return write


def _export(module: str, directory: Path) -> str:
    result = runner.invoke(app, ["schemas", "export", module, "--to", str(directory)])
    assert result.exit_code == 0, result.output
    return result.output


def _check(module: str, directory: Path, *options: str) -> tuple[int, str]:
    result = runner.invoke(app, ["schemas", "check", module, "--against", str(directory), *options])
    return result.exit_code, result.output


def test_export_writes_one_stable_file_per_type_and_version(
    write_module: WriteModule, tmp_path: Path
) -> None:
    module = write_module(V2_ADDED)
    schemas = tmp_path / "schemas"
    output = _export(f"{module}:registry", schemas)
    assert output.splitlines()[0] == f"exported 2 schema(s) to {schemas}: 2 changed"
    names = sorted(path.name for path in schemas.iterdir())
    assert names == ["shop.order_placed.v1.json", "shop.order_placed.v2.json"]
    text = (schemas / "shop.order_placed.v1.json").read_text()
    document = json.loads(text)
    facts = document["$defs"]["x-outboxkit"]["const"]
    assert (facts["ce-type"], facts["key-field"]) == ("shop.order_placed", "order_id")
    assert text == json.dumps(document, indent=2, sort_keys=True) + "\n"
    again = _export(f"{module}:registry", schemas)
    assert again.splitlines() == [f"exported 2 schema(s) to {schemas}: 0 changed"]


#: Version 2 only, version 1 read through an upcaster.
V2_UPCAST = """
from outboxkit.schemas import Event, EventRegistry

registry = EventRegistry()


@registry.register
class OrderPlacedV2(Event, type="shop.order_placed", version=2, topic="shop.orders",
                   key_field="order_id"):
    order_id: str
    total: int = 0


@registry.upcaster(OrderPlacedV2, from_version=1)
def _v1(payload):
    payload.pop("color", None)
    return payload
"""
#: The same without the upcaster: version 1 records can no longer be read.
V2_ONLY = V2_UPCAST[: V2_UPCAST.index("@registry.upcaster")]


def test_export_keeps_the_schemas_of_versions_no_longer_registered(
    write_module: WriteModule, tmp_path: Path
) -> None:
    """v1's schema stays after v2 replaces it: a later change that removes the upcaster is
    then judged against it (it failed against the earlier snapshot only)."""
    schemas = tmp_path / "schemas"
    _export(write_module(V1), schemas)
    (schemas / "README.md").write_text("our event schemas\n")
    output = _export(write_module(V2_UPCAST), schemas)
    assert "  kept shop.order_placed.v1.json" in output
    assert sorted(p.name for p in schemas.iterdir()) == [
        "README.md",
        "shop.order_placed.v1.json",
        "shop.order_placed.v2.json",
    ]
    assert _check(write_module(V2_UPCAST), schemas)[0] == 0
    code, output = _check(write_module(V2_ONLY), schemas)
    assert code == 1, output
    assert "shop.order_placed v1" in output
    assert "version removed" in output or "no model or upcaster reads it" in output


def test_prune_deletes_what_the_registry_no_longer_reads_and_nothing_it_reads(
    write_module: WriteModule, tmp_path: Path
) -> None:
    schemas = tmp_path / "schemas"
    _export(write_module(V1), schemas)
    _export(write_module(V2_UPCAST), schemas)
    refused = runner.invoke(
        app, ["schemas", "export", write_module(V2_UPCAST), "--to", str(schemas), "--prune"]
    )
    assert refused.exit_code == 2, refused.output
    assert "shop.order_placed.v1.json still read by the registry" in refused.output
    pruned = runner.invoke(
        app, ["schemas", "export", write_module(V2_ONLY), "--to", str(schemas), "--prune"]
    )
    assert pruned.exit_code == 0, pruned.output
    assert "  removed shop.order_placed.v1.json" in pruned.output.splitlines()
    assert sorted(p.name for p in schemas.iterdir()) == ["shop.order_placed.v2.json"]


def test_check_passes_a_compatible_change(write_module: WriteModule, tmp_path: Path) -> None:
    _export(write_module(V1), tmp_path)
    code, output = _check(write_module(V2_ADDED), tmp_path)
    assert code == 0, output
    assert output.splitlines()[0] == "compatible: 1 type, 2 versions checked (FULL)"
    assert "note: shop.order_placed v2: version added (new version)" in output


def test_check_fails_a_breaking_change_and_says_what_to_do(
    write_module: WriteModule, tmp_path: Path
) -> None:
    _export(write_module(V1), tmp_path)
    code, output = _check(write_module(REQUIRED_ADDED), tmp_path)
    assert code == 1
    assert output.splitlines() == [
        "1 change(s) break FULL compatibility:",
        "  shop.order_placed v1 coupon: required field added (no default) — breaks BACKWARD",
        "    older records lack it",
        "    → give it a default, or bump the version and register an upcaster that fills it in",
    ]


def test_the_mode_decides(write_module: WriteModule, tmp_path: Path) -> None:
    """An enum value added breaks FORWARD (the default FULL too), not BACKWARD."""
    _export(write_module(V1), tmp_path)
    module = write_module(ENUM_ADDED)
    assert _check(module, tmp_path)[0] == 1
    assert _check(module, tmp_path, "--mode", "forward")[0] == 1
    code, output = _check(module, tmp_path, "--mode", "BACKWARD")
    assert code == 0, output
    assert "note: shop.order_placed v1 color: enum value added" in output
    assert _check(module, tmp_path, "--mode", "sideways")[0] == 2


def test_check_prints_json(write_module: WriteModule, tmp_path: Path) -> None:
    _export(write_module(V1), tmp_path)
    code, output = _check(write_module(REQUIRED_ADDED), tmp_path, "--json")
    assert code == 1
    report = json.loads(output)
    assert (report["mode"], report["compatible"], report["against"]) == (
        "full",
        False,
        str(tmp_path),
    )
    assert [f["rule"] for f in report["breaking"]] == [Rule.REQUIRED_FIELD_ADDED.value]


def test_the_directory_can_come_from_the_environment(
    write_module: WriteModule, tmp_path: Path
) -> None:
    module = write_module(V1)
    _export(module, tmp_path)
    result = runner.invoke(
        app, ["schemas", "check", module], env={"OUTBOXKIT_SCHEMAS_DIR": str(tmp_path)}
    )
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("source", "target", "message"),
    [
        ("x = 1\n", "{module}", "has no EventRegistry: make one beside your events"),
        (
            V1 + "other = EventRegistry()\n",
            "{module}",
            "has several EventRegistry objects (other, registry)",
        ),
        (V1, "{module}:OrderPlaced", "is not an outboxkit.schemas.EventRegistry"),
        # A misspelt attribute was "got None".
        (V1, "{module}:registy", "has no attribute 'registy'; did you mean {module}:registry?"),
        ("x = 1\n", "{module}:registry", "has no attribute 'registry'; it has no EventRegistry"),
        (V1, "no_such_module_anywhere:registry", "cannot import 'no_such_module_anywhere'"),
    ],
)
def test_a_target_that_is_not_one_registry_is_exit_2(
    write_module: WriteModule, tmp_path: Path, source: str, target: str, message: str
) -> None:
    module = write_module(source)
    result = runner.invoke(
        app, ["schemas", "export", target.format(module=module), "--to", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert message.format(module=module) in result.output


def test_the_only_registry_of_a_module_is_found(write_module: WriteModule, tmp_path: Path) -> None:
    module = write_module(V1 + "same = registry\n")  # one registry under two names
    _export(module, tmp_path)
    assert (tmp_path / "shop.order_placed.v1.json").exists()


def test_checking_against_nothing_is_exit_2(write_module: WriteModule, tmp_path: Path) -> None:
    code, output = _check(write_module(V1), tmp_path / "missing")
    assert code == 2
    assert "no exported schemas in" in output
    assert "outboxkit schemas export" in output


def test_a_file_that_is_not_a_schema_is_named(write_module: WriteModule, tmp_path: Path) -> None:
    module = write_module(V1)
    _export(module, tmp_path)
    (tmp_path / "notes.json").write_text('{"todo": []}')
    code, output = _check(module, tmp_path)
    assert code == 2
    assert f"{tmp_path}/notes.json: not an event schema" in output


# -- the pytest helper ----------------------------------------------------------------------


def _registry(write_module, source: str) -> EventRegistry:
    registry: EventRegistry = importlib.import_module(write_module(source)).registry
    return registry


def test_the_helper_passes_a_compatible_registry(write_module, tmp_path: Path) -> None:
    _export(write_module(V1), tmp_path)
    assert_compatible(_registry(write_module, V2_ADDED), against=tmp_path)
    assert exported_helper is assert_compatible


def test_the_helper_fails_with_the_list_of_breaking_changes(
    write_module: WriteModule, tmp_path: Path
) -> None:
    _export(write_module(V1), tmp_path)
    registry = _registry(write_module, ENUM_ADDED)
    assert_compatible(registry, against=str(tmp_path), mode="backward")
    with pytest.raises(AssertionError) as failure:
        assert_compatible(registry, against=tmp_path, mode="full")
    assert str(failure.value).splitlines()[:2] == [
        "1 change(s) break FULL compatibility:",
        '  shop.order_placed v1 color: enum value added (added "green") — breaks FORWARD',
    ]


def test_the_helper_needs_exported_schemas(write_module: WriteModule, tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="no exported schemas"):
        assert_compatible(_registry(write_module, V1), against=tmp_path)


def test_a_module_with_events_and_no_registry_is_told_how_to_make_one(
    write_module: WriteModule, tmp_path: Path
) -> None:
    module = write_module(
        V1.replace("registry = EventRegistry()", "").replace("@registry.register", "")
    )
    result = runner.invoke(app, ["schemas", "export", module, "--to", str(tmp_path)])
    assert result.exit_code == 2
    assert "has no EventRegistry (it has the events OrderPlaced)" in result.output
    assert "registry.register(OrderPlaced)" in result.output
    assert f"{module}:registry" in result.output


def test_the_commands_modes_are_the_checkers() -> None:
    assert [mode.value for mode in Mode] == [mode.value for mode in CompatibilityMode]


def test_no_service_path_loads_the_compatibility_checker() -> None:
    """schemas/ does one job at run time: the checker is a developer's tool, loaded by the
    command and the test helper when they run, and by its names on first use."""
    code = (
        "import sys, outboxkit.schemas, outboxkit.relay, outboxkit.inbox, outboxkit.cli, "
        "outboxkit.testing.schemas\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('outboxkit.schemas.compat'))\n"
        "assert not loaded, loaded\n"
        "from outboxkit.schemas import check_compatibility, Snapshot\n"
        "assert 'outboxkit.schemas.compat' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
