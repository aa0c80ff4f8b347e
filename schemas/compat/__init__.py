"""Which changes of an event stay readable by whom: a developer's tool, not a service's.

The checker compares a registry with the JSON Schemas exported earlier (docs/schemas.md):
:mod:`.snapshot` writes and reads them, :mod:`.schema_walk` compares two schemas of one event,
:mod:`.compatibility` names the rules. ``outboxkit schemas`` and
:mod:`outboxkit.testing.schemas` import it when they run; :mod:`outboxkit.schemas` names its
public parts without importing it (a service, an inbox, a Spark executor never loads it).
"""

from outboxkit.schemas.compat.compatibility import (
    DEFAULT_MODE,
    CompatibilityMode,
    CompatibilityReport,
    Rule,
    check_compatibility,
)
from outboxkit.schemas.compat.snapshot import Snapshot

__all__ = [
    "DEFAULT_MODE",
    "CompatibilityMode",
    "CompatibilityReport",
    "Rule",
    "Snapshot",
    "check_compatibility",
]
