"""Kafka's default partitioner for keyed records, as pure functions.

The Java client (and aiokafka, librdkafka's ``murmur2_random``) send a record with a key to
partition ``to_positive(murmur2(key)) % num_partitions``. Computing it here lets the relay and
the tests know where an event lands without asking a broker.
"""

from outboxkit.schemas.exceptions import SchemaError

_MASK = 0xFFFFFFFF
_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24


def murmur2(data: bytes) -> int:
    """MurmurHash2 exactly as Kafka's ``Utils.murmur2``: a signed 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    tail = length - length % 4
    for i in range(0, tail, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> _R
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    remainder = length % 4
    if remainder == 3:
        h ^= data[tail + 2] << 16
    if remainder >= 2:
        h ^= data[tail + 1] << 8
    if remainder >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(number: int) -> int:
    """Kafka's ``Utils.toPositive``: the low 31 bits (not ``abs``, which fails on MIN_VALUE)."""
    return number & 0x7FFFFFFF


def partition_for_key(key: bytes | str, num_partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key`` (a str is UTF-8 encoded)."""
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int):
        raise SchemaError(f"num_partitions must be an int, got {type(num_partitions).__name__}")
    if num_partitions < 1:
        raise SchemaError(f"num_partitions must be >= 1, got {num_partitions}")
    data = key.encode("utf-8") if isinstance(key, str) else key
    return to_positive(murmur2(data)) % num_partitions
