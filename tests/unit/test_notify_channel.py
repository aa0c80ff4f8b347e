"""The relay LISTENs where the outbox's trigger NOTIFYs. The channel is written twice — in the
relay (``CHANNEL``) and in the migration that defines the trigger's function, which can never
change once released — so this test holds the two together: a relay listening elsewhere would
never wake on commit and publish only at its sweep interval."""

from __future__ import annotations

import re

from outboxkit.migrations import load_migrations
from outboxkit.relay.postgres.storage import CHANNEL


def test_the_relay_listens_on_the_channel_the_newest_trigger_function_notifies() -> None:
    channels = [
        found
        for migration in load_migrations("postgresql")
        for found in re.findall(r"pg_notify\('([^']+)'", migration.sql)
    ]
    assert channels, "no migration NOTIFYs: the relay would never be woken"
    assert channels[-1] == CHANNEL
    assert set(channels) == {CHANNEL}, "every version of the trigger notifies one channel"
