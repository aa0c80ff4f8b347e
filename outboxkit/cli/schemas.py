"""``outboxkit schemas export`` and ``outboxkit schemas check``: a CI gate on event changes.

``export`` writes the JSON Schema of each ``(type, version)`` of an :class:`EventRegistry` to a
directory, to commit; ``check`` compares the registry with that directory and fails (exit code
1) on a change that breaks the compatibility mode (:mod:`outboxkit.schemas.compat.compatibility` has
the rules, docs/schemas.md the table).
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from outboxkit.cli.common import EXIT_FAILED, fail_config, import_user_module, user_object
from outboxkit.cli_options import JsonOutput
from outboxkit.core.exceptions import ConfigurationError
from outboxkit.schemas import Event, EventRegistry

if TYPE_CHECKING:
    from outboxkit.schemas.compat import Snapshot


class Mode(StrEnum):
    """:class:`outboxkit.schemas.compat.CompatibilityMode`'s values (a test holds them to it),
    written out so that the command loads the checker only when it runs."""

    BACKWARD = "backward"
    FORWARD = "forward"
    FULL = "full"
    BACKWARD_TRANSITIVE = "backward_transitive"
    FORWARD_TRANSITIVE = "forward_transitive"
    FULL_TRANSITIVE = "full_transitive"


schemas_app = typer.Typer(
    help="Export the JSON Schemas of your events, and check a change against them in CI.",
    no_args_is_help=True,
)

Target = Annotated[
    str,
    typer.Argument(
        metavar="MODULE[:REGISTRY]",
        help="Your EventRegistry as module:attribute (e.g. shop.events:registry); the module's "
        "only EventRegistry when the attribute is left out.",
    ),
]
SchemasDir = Annotated[
    Path,
    typer.Option(
        envvar="OUTBOXKIT_SCHEMAS_DIR",
        metavar="DIR",
        help="The directory of the exported schemas (one <type>.v<version>.json each).",
    ),
]


@schemas_app.command("export")
def export_command(
    target: Target,
    *,
    to: SchemasDir,
    prune: Annotated[
        bool,
        typer.Option(
            "--prune",
            help="Also delete the schemas of versions the registry neither registers nor "
            "reads (their records are gone from every topic, outbox and dead-letter topic). "
            "Refused for a version a registered upcaster or model still reads.",
        ),
    ] = False,
) -> None:
    """Write one JSON Schema per event type and version to DIR (stable text: an unchanged
    registry changes no file). The schemas of versions no longer registered stay (`check`
    judges a removed upcaster against them) unless --prune. Commit the directory: `outboxkit
    schemas check` compares later changes with it."""
    from outboxkit.schemas.compat import Snapshot  # noqa: PLC0415 (on use)

    registry = _registry_of(target)
    snapshot = Snapshot.of_registry(registry)
    try:
        to.mkdir(parents=True, exist_ok=True)
        kept = _unregistered(snapshot, to)
        readable = sorted(
            name for name, slot in kept.items() if slot[1] in registry.readable_versions(slot[0])
        )
        if prune and readable:
            raise fail_config(
                ConfigurationError(
                    f"--prune refused: {', '.join(readable)} still read by the registry (an "
                    "upcaster from that version): remove the upcaster first"
                )
            )
        written = _write(snapshot, to)
        removed = sorted(kept) if prune else []
        for name in removed:
            (to / name).unlink()
    except OSError as exc:
        raise fail_config(ConfigurationError(f"cannot write to {to}: {exc}")) from None
    summary = f"exported {len(snapshot)} schema(s) to {to}: {len(written)} changed"
    typer.echo(summary + (f", {len(removed)} removed" if removed else ""))
    for name in written:
        typer.echo(f"  wrote {name}")
    for name in removed:
        typer.echo(f"  removed {name}")
    for name in [] if prune else sorted(kept):
        typer.echo(f"  kept {name} (not registered; --prune deletes it once no record needs it)")


@schemas_app.command("check")
def check_command(
    target: Target,
    *,
    against: SchemasDir,
    mode: Annotated[
        Mode,
        typer.Option(
            envvar="OUTBOXKIT_SCHEMAS_MODE",
            case_sensitive=False,
            metavar="MODE",
            help="Who must read what: backward (new readers read old records: consumers "
            "deploy first), forward (old readers read new records: producers deploy first), "
            "full (both: either order, and rolling deploys); backward_transitive, "
            "forward_transitive, full_transitive: the same against every version the "
            "directory keeps, not only each type's latest.",
        ),
    ] = Mode.FULL,
    json_output: JsonOutput = False,
) -> None:
    """Compare the registry with the schemas exported to DIR. Exit code 1, with each change
    that breaks MODE, what it breaks and what to do instead; 0 otherwise. The default, full:
    producers and consumers are released in either order, and a rolling deploy runs old and
    new instances side by side, so old records meet new readers and new records old ones."""
    from outboxkit.schemas.compat import check_compatibility  # noqa: PLC0415 (on use)

    snapshot = _snapshot_of(target)
    baseline = _read(against)
    report = check_compatibility(snapshot, baseline, mode.value)
    if json_output:
        typer.echo(json.dumps({**report.as_dict(), "against": str(against)}, indent=2))
    else:
        for line in report.lines():
            typer.echo(line)
    if not report.compatible:
        raise typer.Exit(EXIT_FAILED)


def _snapshot_of(target: str) -> Snapshot:
    from outboxkit.schemas.compat import Snapshot  # noqa: PLC0415 (on use)

    return Snapshot.of_registry(_registry_of(target))


def _registry_of(target: str) -> EventRegistry:
    try:
        return import_registry(target)
    except ConfigurationError as exc:
        raise fail_config(exc) from None


def import_registry(target: str) -> EventRegistry:
    """The registry ``module:attribute`` names, or the module's only one without the attribute.
    Raises :class:`ConfigurationError` saying what to give instead."""
    module_name, _, attribute = target.partition(":")
    if not module_name:
        raise ConfigurationError(f"{target!r}: give the EventRegistry as module[:attribute]")
    module = import_user_module(module_name)
    if attribute:
        return user_object(
            target, module, attribute, EventRegistry, "outboxkit.schemas.EventRegistry"
        )
    found: dict[int, list[str]] = {}
    for name, value in sorted(vars(module).items()):
        if isinstance(value, EventRegistry):
            found.setdefault(id(value), []).append(name)
    if len(found) == 1:
        return next(v for v in vars(module).values() if isinstance(v, EventRegistry))
    if not found:
        events = sorted(
            name
            for name, value in vars(module).items()
            if isinstance(value, type) and issubclass(value, Event) and value is not Event
        )
        example = events[0] if events else "OrderPlaced"
        raise ConfigurationError(
            f"module {module_name!r} has no EventRegistry"
            + (f" (it has the events {', '.join(events[:5])})" if events else "")
            + ": make one beside your events, `registry = EventRegistry()` and "
            f"`registry.register({example})` for each (or `@registry.register` on each "
            f"class), then give it as {module_name}:registry"
        )
    names = ", ".join(names[0] for names in found.values())
    raise ConfigurationError(
        f"module {module_name!r} has several EventRegistry objects ({names}): give one as "
        f"{module_name}:attribute"
    )


def _read(directory: Path) -> Snapshot:
    """The snapshot exported to ``directory``; a missing or empty one is a usage error."""
    from outboxkit.schemas.compat import Snapshot  # noqa: PLC0415 (on use)

    try:
        files = {path.name: path.read_text() for path in sorted(directory.glob("*.json"))}
        snapshot = Snapshot.from_files(files)
    except ConfigurationError as exc:
        raise fail_config(ConfigurationError(f"{directory}/{exc}")) from None
    except OSError as exc:
        raise fail_config(ConfigurationError(f"cannot read {directory}: {exc}")) from None
    if not len(snapshot):
        raise fail_config(
            ConfigurationError(
                f"no exported schemas in {directory}: run `outboxkit schemas export "
                f"MODULE[:REGISTRY] --to {directory}` once, and commit the directory"
            )
        )
    return snapshot


def _write(snapshot: Snapshot, directory: Path) -> list[str]:
    """Write each file whose text changed; their names."""
    written = []
    for name, text in snapshot.files().items():
        path = directory / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(name)
    return written


def _unregistered(snapshot: Snapshot, directory: Path) -> dict[str, tuple[str, int]]:
    """The exported schemas in ``directory`` of versions ``snapshot`` does not have: file name
    → (type, version). Other files are not looked at."""
    from outboxkit.schemas.compat.snapshot import snapshot_slot  # noqa: PLC0415 (on use)

    current = set(snapshot.files())
    found = {}
    for path in sorted(directory.glob("*.json")):
        if path.name in current:
            continue
        slot = snapshot_slot(path.read_text())
        if slot is not None:
            found[path.name] = slot
    return found
