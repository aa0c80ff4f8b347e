"""Structured logs: key=value for people, JSON lines for log pipelines (``--log-format json``).

outboxkit logs through structlog with the event id, partition and error as fields; the standard
``logging`` records of aiokafka and psycopg go through the same renderer.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["console", "json"]


def level_number(level: str) -> int:
    """``logging``'s number for a level's name (any case); INFO for a name it does not know."""
    return logging.getLevelNamesMapping().get(level.strip().upper(), logging.INFO)


def filter_unconfigured(level: str) -> None:
    """In a process that did not configure structlog (a web service that embeds outboxkit),
    structlog prints every level, debug included: leave out what is below ``level`` and change
    nothing else (where and how it prints). A process that configured structlog is left as it
    is, and one that configures it later replaces this."""
    if not structlog.is_configured():
        structlog.configure(
            wrapper_class=structlog.make_filtering_bound_logger(level_number(level))
        )


def configure_logging(fmt: LogFormat = "console", level: str = "INFO") -> None:
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        # Plain tracebacks, without the values of local variables (rich's default shows them):
        # they may hold secrets, and rendering them calls repr() on anything — a py4j object's
        # repr() calls into Spark's JVM, which may be shutting down, inside the handler's lock.
        else structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        )
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiokafka logs every reconnect attempt at ERROR, many per second while a broker is down;
    # outboxkit logs each failure it retries once, with its backoff. Debug shows them all.
    if root.level > logging.DEBUG:
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
