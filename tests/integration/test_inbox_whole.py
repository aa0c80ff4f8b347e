"""Every event arrives whole through the real inbox, on PostgreSQL and MongoDB: a sample of
generated models (tests/event_models.py) and one event of each, written as a relay writes them
to Apache Kafka; the inbox's handler receives, in its transaction, an event equal to the one
written, with every field set. The registry's property (tests/unit/test_schemas_whole.py) runs
the many examples; this is the same path through the broker, the inbox and its store."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from outboxkit.core.settings import ConnectionSettings
from outboxkit.inbox import Inbox, InboxSettings
from outboxkit.schemas import Event, SchemaError, encode
from outboxkit.service import Outboxkit
from tests.event_models import build, events, model_specs
from tests.integration.conftest import MakeTopic
from tests.integration.inbox_harness import group_of, produce, wait_caught_up
from tests.timeouts import SERVICE_SETTINGS
from tests.unit.test_schemas_whole import assert_whole

pytestmark = [pytest.mark.timeout(120)]

SAMPLE = 12


@st.composite
def written(draw: st.DrawFn) -> Event:
    """An event of a new model, that the writer accepts."""
    spec = draw(model_specs())
    event = draw(events(spec, build(spec)))
    try:
        encode(event, source="urn:test")
    except SchemaError:
        return draw(written())
    return event


@settings(
    max_examples=1,
    phases=[Phase.generate],  # one run through the servers; a failure prints its blob
    deadline=None,
    print_blob=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(sample=st.lists(written(), min_size=SAMPLE, max_size=SAMPLE))
async def test_the_inbox_hands_every_event_over_whole(
    db_url: str, kafka_bootstrap: str, make_topic: MakeTopic, sample: list[Event]
) -> None:
    topic = await make_topic("whole", partitions=2)
    await make_topic(name=f"{topic}.dlq")
    sample = [event.model_copy(update={"topic": topic}) for event in sample]
    received: dict[Any, Event] = {}
    inbox: Inbox[Any] = Inbox(topic)
    for model in {type(event) for event in sample}:

        @inbox.handler(model)
        async def handle(event: Event, tx: Any) -> None:
            received[event.id] = event

    await produce(kafka_bootstrap, sample)
    kit = Outboxkit(
        source="urn:test",
        settings=ConnectionSettings(database_url=db_url),
        inbox=inbox,
        inbox_settings=InboxSettings(
            database_url=db_url,
            kafka_bootstrap_servers=[kafka_bootstrap],
            topics=[topic],
            **SERVICE_SETTINGS,
        ),
        registry=CollectorRegistry(),
    )
    async with kit.lifespan():
        await wait_caught_up(
            kafka_bootstrap, group_of(topic), topic, 2, within=60, what="the inbox caught up"
        )
    assert sorted(received, key=str) == sorted((event.id for event in sample), key=str)
    for event in sample:
        assert_whole(received[event.id], event)
