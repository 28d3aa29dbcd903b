"""Events per second through spotrain's bus, beside raw nats-py on the same server.

Full path: publish (pipelined) → durable pull consumer → decode and validate the
CloudEvent → handler → ack. Baseline: nats-py `publish_async` → durable pull consumer,
`fetch` batches → ack, no decoding. Both pipelines publish and consume concurrently, and
each is timed from the first publish to the last message handled.

    python bench/bus.py [--events 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from shared.events import Event, new_event
from shared.events.data import JobRequested
from shared.localstack.nats_server import NatsServer
from shared.logs import configure_logging
from shared.messaging import BusSettings, Subscription
from shared.messaging.jetstream import JetStreamBus

NOW = time.time()


def make_events(count: int, tag: str) -> list[Event[JobRequested]]:
    from datetime import UTC, datetime  # noqa: PLC0415  # keeps the header short

    now = datetime.now(UTC)
    return [
        new_event(
            JobRequested(
                job_id=f"{tag}-{n}",
                owner="bench",
                experiment="throughput",
                entrypoint=("python", "train.py", "--lr", "0.1"),
                labels={"team": "ml-platform"},
            ),
            source="bench",
            time=now,
        )
        for n in range(count)
    ]


async def full_path(url: str, count: int, round_no: int) -> float:
    settings = BusSettings(nats_url=url, subject_prefix=f"full{round_no}")
    bus = await JetStreamBus.connect(settings, name="bench")
    await bus.ensure_stream()
    events = make_events(count, "full")
    handled = 0
    all_handled = asyncio.Event()

    async def handler(event: Event[Any]) -> None:
        nonlocal handled
        handled += 1
        if handled == count:
            all_handled.set()

    stop = asyncio.Event()
    subscription = Subscription(
        service="bench", routes={JobRequested: handler}, max_concurrency=512
    )
    consumer = asyncio.create_task(bus.consume(subscription, stop))
    await asyncio.sleep(0.5)  # the consumer exists before the clock starts
    started = time.perf_counter()
    for chunk in range(0, count, 1000):
        await bus.publish_many(events[chunk : chunk + 1000])
    await all_handled.wait()
    elapsed = time.perf_counter() - started
    stop.set()
    await consumer
    await bus.close()
    return count / elapsed


async def raw_nats(url: str, count: int, round_no: int) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    stream, subject = f"RAW{round_no}", f"raw{round_no}.job.requested"
    await js.add_stream(StreamConfig(name=stream, subjects=[f"raw{round_no}.>"]))
    payloads = [event.model_dump_json().encode() for event in make_events(count, "raw")]
    await js.add_consumer(
        stream, ConsumerConfig(durable_name="bench", ack_policy=AckPolicy.EXPLICIT)
    )
    psub = await js.pull_subscribe_bind(durable="bench", stream=stream)
    received = 0

    async def consume() -> None:
        nonlocal received
        while received < count:
            try:
                messages = await psub.fetch(500, timeout=1)
            except nats.errors.TimeoutError:
                continue
            for msg in messages:
                await msg.ack()
            received += len(messages)

    consumer = asyncio.create_task(consume())
    await asyncio.sleep(0.5)
    started = time.perf_counter()
    for chunk in range(0, count, 1000):
        futures = [
            await js.publish_async(subject, payload) for payload in payloads[chunk : chunk + 1000]
        ]
        await asyncio.gather(*futures)
    await consumer
    elapsed = time.perf_counter() - started
    await nc.close()
    return count / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    configure_logging(json=True, level="warning")
    with tempfile.TemporaryDirectory() as store:
        server = NatsServer(Path(store))
        server.start()
        try:
            full, raw = [], []
            for round_no in range(args.rounds):
                # Alternate the order so neither side always runs on a warmer server.
                if round_no % 2 == 0:
                    raw.append(await raw_nats(server.url, args.events, round_no))
                    full.append(await full_path(server.url, args.events, round_no))
                else:
                    full.append(await full_path(server.url, args.events, round_no))
                    raw.append(await raw_nats(server.url, args.events, round_no))
                print(f"round {round_no + 1}: full {full[-1]:,.0f}/s  raw {raw[-1]:,.0f}/s")
        finally:
            server.stop()
    full_median, raw_median = statistics.median(full), statistics.median(raw)
    print(f"events: {args.events}")
    print(f"rounds: {args.rounds}")
    print(f"raw_nats_events_per_s: {raw_median:.0f}")
    print(f"full_path_events_per_s: {full_median:.0f}")
    print(f"full_to_raw_ratio: {full_median / raw_median:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
