"""outboxkit: write to your database and publish to Kafka, safely.

The components live in subpackages: :mod:`outboxkit.schemas` (events and their wire format),
:mod:`outboxkit.relay` (outbox → Kafka) and :mod:`outboxkit.inbox` (Kafka → handler, once).
"""

from outboxkit._version import __version__
from outboxkit.core.exceptions import ConfigurationError, OutboxkitError

__all__ = ["ConfigurationError", "OutboxkitError", "__version__"]
