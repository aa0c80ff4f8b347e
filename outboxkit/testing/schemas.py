"""``assert_compatible``: the schema gate of ``outboxkit schemas check`` as one line of a test.

::

    from outboxkit.testing.schemas import assert_compatible

    def test_events_stay_compatible() -> None:
        assert_compatible(registry, against="schemas/", mode="full")

Light on purpose: it needs only :mod:`outboxkit.schemas`, no server and no fixture; installed
with the ``[testing]`` extra, as the rest of :mod:`outboxkit.testing` (the package is a pytest
plugin, which imports pytest).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from outboxkit.schemas import EventRegistry

if TYPE_CHECKING:
    from outboxkit.schemas.compat import CompatibilityMode


def assert_compatible(
    registry: EventRegistry,
    against: str | Path,
    mode: CompatibilityMode | str = "full",
) -> None:
    """Fail (``AssertionError``, each breaking change listed with what to do instead) when
    ``registry`` is not compatible in ``mode`` with the schemas exported to ``against``."""
    from outboxkit.schemas.compat import Snapshot, check_compatibility  # noqa: PLC0415 (on use)

    directory = Path(against)
    files = {path.name: path.read_text() for path in sorted(directory.glob("*.json"))}
    baseline = Snapshot.from_files(files)
    if not len(baseline):
        raise AssertionError(
            f"no exported schemas in {directory}: run `outboxkit schemas export "
            f"MODULE[:REGISTRY] --to {directory}` once, and commit the directory"
        )
    report = check_compatibility(registry, baseline, mode)
    if not report.compatible:
        raise AssertionError("\n".join(report.lines()))
