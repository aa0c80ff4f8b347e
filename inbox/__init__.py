"""The inbox: consumes events and runs each handler's effects exactly once."""

from outboxkit.inbox.exceptions import InboxError

__all__ = ["InboxError"]
