"""The foundation every outboxkit package stands on, importing none of them: the root exception,
the settings base, connection construction for PostgreSQL and Kafka, logging and SQL loading.

Layers, lowest first (``pyproject.toml``'s import-linter contract keeps them one-way):
``outboxkit.core`` → ``outboxkit.schemas`` → the engines (``relay``, ``inbox``, ``pipeline``)
→ the applications (``cli``, ``service``, ``fastapi``, ``demo``, ``embedded``, ``backends``).
"""

from outboxkit.core.exceptions import ConfigurationError, OutboxkitError

__all__ = ["ConfigurationError", "OutboxkitError"]
