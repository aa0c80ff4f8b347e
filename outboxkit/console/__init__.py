"""The outboxkit console: the outbox's flow and what is stuck, in a browser (the ``[console]``
extra). Mount it in a FastAPI service, ``app.mount("/outboxkit", console(kit))``, or run it
alone with ``outboxkit console``; docs/console.md shows its pages.

Importing this package loads neither FastAPI nor Jinja2: :func:`console` does, when called.
"""

import typing

from outboxkit.console.settings import ConsoleSettings, InboxView
from outboxkit.core import lazy

if typing.TYPE_CHECKING:
    from outboxkit.console.app import console

__all__ = ["ConsoleSettings", "InboxView", "console"]

__getattr__ = lazy.lazy_exports(__name__, {"console": "outboxkit.console.app"})
