"""What the relays' database backends share to tell that a relay process has died.

Kafka learns that a consumer-group member died only when its session times out, and every
rebalance waits for it until then. A database learns it at once: the kernel closes a killed
process's sockets, and the server ends its sessions (PostgreSQL releases their advisory locks,
MongoDB drops their connections from ``$currentOp``). Each relay keeps a *presence* on the
database that only its own process can hold, named after the process (its Kafka client id,
announced before it joins); a survivor that finds a process's presence gone removes its members
from the group (:class:`~outboxkit.relay.departed.DepartedCheck`). The storages call the name
a "member id": any string the relay announces.
"""

from __future__ import annotations

import hashlib

__all__ = ["RECONNECT_GRACE", "member_digest"]

#: Departures are not trusted for this long after this relay's own presence (re)appeared, or
#: after the database restarted: every relay's presence ended then, and the first one back would
#: see the others as gone before they had a chance to reconnect (they check every second).
RECONNECT_GRACE = 3.0


def member_digest(group: str, member_id: str) -> bytes:
    """Eight bytes naming ``member_id`` of ``group`` (an advisory lock key, an appName)."""
    return hashlib.blake2b(f"{group}\0{member_id}".encode(), digest_size=8).digest()
