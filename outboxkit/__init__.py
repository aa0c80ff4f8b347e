"""outboxkit: write to your database and publish to Kafka, safely.

The components live in subpackages: :mod:`outboxkit.schemas` (events and their wire format),
:mod:`outboxkit.relay` (outbox → Kafka) and :mod:`outboxkit.inbox` (Kafka → handler, once).
The package itself holds what every component shares: the settings of the connections, the
loader that validates settings objects from ``OUTBOXKIT_*``, the workers' logging, and the
exceptions' base.
"""

import typing

from outboxkit._version import __version__
from outboxkit.core import lazy
from outboxkit.core.exceptions import ConfigurationError, OutboxkitError

if typing.TYPE_CHECKING:
    from outboxkit.core.logs import configure_logging
    from outboxkit.core.settings import ConnectionSettings, load_settings

#: Imported on first use: ``import outboxkit.schemas`` (a Spark worker's decoder, a writer)
#: loads neither pydantic-settings nor structlog's console renderer through its parent.
__getattr__ = lazy.lazy_exports(
    __name__,
    {
        "ConnectionSettings": "outboxkit.core.settings",
        "configure_logging": "outboxkit.core.logs",
        "load_settings": "outboxkit.core.settings",
    },
)

__all__ = [
    "ConfigurationError",
    "ConnectionSettings",
    "OutboxkitError",
    "__version__",
    "configure_logging",
    "load_settings",
]
