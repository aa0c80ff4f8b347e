"""Kafka's default partitioner: murmur2 as the Java client computes it, checked with aiokafka."""

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given, settings
from hypothesis import strategies as st

from outboxkit.schemas import SchemaError, murmur2, partition_for_key, to_positive

# Copied from Apache Kafka, clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java,
# testMurmur2 (keys are String.getBytes(), i.e. ASCII here).
KAFKA_MURMUR2_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (bytes([ord("a"), ord("b"), ord("c")]), 479470107),
]


@pytest.mark.parametrize(("data", "expected"), KAFKA_MURMUR2_VECTORS)
def test_murmur2_matches_kafka_test_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


@pytest.mark.parametrize(
    ("number", "expected"),
    [(0, 0), (5, 5), (-1, 0x7FFFFFFF), (-(2**31), 0), (2**31 - 1, 2**31 - 1)],
)
def test_to_positive_keeps_the_low_31_bits(number: int, expected: int) -> None:
    assert to_positive(number) == expected


def test_partition_of_a_str_key_is_that_of_its_utf8_bytes() -> None:
    assert partition_for_key("kunde-ü", 12) == partition_for_key("kunde-ü".encode(), 12)


def test_partition_for_kafka_vectors() -> None:
    for data, hashed in KAFKA_MURMUR2_VECTORS:
        assert partition_for_key(data, 7) == (hashed & 0x7FFFFFFF) % 7


def test_one_partition_takes_every_key() -> None:
    assert partition_for_key(b"anything", 1) == 0


@pytest.mark.parametrize("num_partitions", [0, -3, True, 2.0])
def test_num_partitions_must_be_a_positive_int(num_partitions: int) -> None:
    with pytest.raises(SchemaError, match="num_partitions"):
        partition_for_key(b"k", num_partitions)


@settings(max_examples=300)
@given(st.binary(max_size=64))
def test_murmur2_is_a_signed_32_bit_int_equal_to_aiokafka(data: bytes) -> None:
    hashed = murmur2(data)
    assert -(2**31) <= hashed < 2**31
    assert hashed & 0xFFFFFFFF == aiokafka_murmur2(data)


@settings(max_examples=300)
@given(st.binary(max_size=64), st.integers(min_value=1, max_value=1000))
def test_partition_for_key_agrees_with_aiokafka_default_partitioner(
    key: bytes, num_partitions: int
) -> None:
    partitions = list(range(num_partitions))
    assert partition_for_key(key, num_partitions) == DefaultPartitioner()(
        key, partitions, partitions
    )
