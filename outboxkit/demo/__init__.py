"""``outboxkit demo``: the whole flow on one machine with no external services."""
