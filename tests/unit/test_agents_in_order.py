"""The job stage reads each input partition in offset order, whatever faust delivers (streams.agents.InOrder),
and faust never counts an offset gap as acked (streams.agents.GaplessConsumer).

The delivery below is the one the fault suite caught after an assignment: a partition's offsets 52 to 89, then
495 onwards, then 52 again once the consumer sought back. The consumer is a stand-in (what is tested is which
records are admitted and where the partition is sought); the gap test runs on faust's own consumer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from base.settings import BrokerSettings, Settings
from processors.idle_agents import build_app
from streams.agents import GaplessConsumer, InOrder

DM = TP("t.usage.device-minutes.v1", 0)
JOBS = TP("t.sched.job-events.v1", 0)


class Consumer:
    def __init__(self, committed: dict[TP, int]) -> None:
        self.committed = committed  # the broker's
        self.seeks: list[dict[TP, int]] = []
        self.positions: dict[TP, int] = {}  # the fetch position

    async def committed_offset(self, tp: TP) -> int | None:
        return self.committed.get(tp)

    async def fetch_position(self, tp: TP) -> int | None:
        return self.positions.get(tp)

    async def seek_wait(self, partitions: dict[TP, int]) -> None:
        self.seeks.append(dict(partitions))

    async def earliest_offsets(self, *tps: TP) -> dict[TP, int]:
        return {tp: 3 for tp in tps}


def _events(tp: TP, offsets: range | list[int]) -> list[Any]:
    return [SimpleNamespace(message=SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=o, tp=tp))
            for o in offsets]  # fmt: skip


def _offsets(events: list[Any]) -> list[int]:
    return [e.message.offset for e in events]


def test_a_skip_is_dropped_and_sought_back_and_a_redelivery_is_dropped() -> None:
    consumer = Consumer({DM: 52})
    order = InOrder(SimpleNamespace(consumer=consumer))  # type: ignore[arg-type]

    async def scenario() -> None:
        assert _offsets(await order.admit(_events(DM, range(52, 90)))) == list(range(52, 90))
        assert await order.admit(_events(DM, range(495, 500))) == []  # the skip: nothing admitted
        assert consumer.seeks == [{DM: 90}]
        assert await order.admit(_events(DM, range(500, 505))) == []  # fetched before the seek: no second seek
        assert consumer.seeks == [{DM: 90}]
        redelivered = await order.admit(_events(DM, range(52, 95)))  # after the seek, from the committed offset
        assert _offsets(redelivered) == list(range(90, 95)) and order.seeks_back == 1

    asyncio.run(scenario())


def test_a_partition_fetched_past_what_was_admitted_is_behind_and_sought_back_once_it_stalls(monkeypatch) -> None:
    """faust fetched 52 to 99 and dropped 90 to 99 (the end of the partition, a rebalance starting): no later
    record shows the skip. The check sees the fetch position past the next offset: the partition is behind at
    once, and sought back only once it made no progress for `RESEEK_AFTER_S`."""
    consumer = Consumer({DM: 52})
    order = InOrder(SimpleNamespace(consumer=consumer))  # type: ignore[arg-type]
    other = TP(DM.topic, 1)

    async def scenario() -> None:
        consumer.positions = {DM: 90, other: 7}
        consumer.committed[other] = 7
        await order.admit(_events(DM, range(52, 90)))
        await order.check([DM, other])
        assert not order.behind and consumer.seeks == []  # admitted what was fetched; partition 1 at its commit
        consumer.positions[DM] = 100
        await order.check([DM])
        assert set(order.behind) == {(DM.topic, 0)} and consumer.seeks == []  # records may still be on the way
        await order.check([DM])
        assert consumer.seeks == []  # not stalled long enough yet
        monkeypatch.setattr("streams.agents.RESEEK_AFTER_S", 0.0)
        await order.check([DM])
        assert consumer.seeks == [{DM: 90}] and order.seeks_back == 1
        consumer.positions[DM] = 90  # the seek
        assert _offsets(await order.admit(_events(DM, range(90, 100)))) == list(range(90, 100))
        consumer.positions[DM] = 100
        await order.check([DM])
        assert not order.behind and len(consumer.seeks) == 1

    asyncio.run(scenario())


def test_a_partition_starts_at_its_committed_offset_else_the_earliest_and_appeals_pass_unordered() -> None:
    consumer = Consumer({})
    order = InOrder(SimpleNamespace(consumer=consumer))  # type: ignore[arg-type]
    appeals = TP("t.appeals.v1", 0)

    async def scenario() -> None:
        assert _offsets(await order.admit(_events(JOBS, [3, 4]))) == [3, 4]  # no commit yet: the earliest, 3
        mixed = _events(appeals, [0, 7]) + _events(JOBS, [6])
        assert _offsets(await order.admit(mixed, unordered=appeals.topic)) == [0, 7]
        assert consumer.seeks == [{JOBS: 5}]
        order.forget((JOBS.topic, 0))  # revoked; assigned again after a commit at 9
        consumer.committed[JOBS] = 9
        assert _offsets(await order.admit(_events(JOBS, [9, 10]))) == [9, 10]

    asyncio.run(scenario())


def test_faust_counts_a_gap_as_acked_and_the_gapless_consumer_does_not(tmp_path: Path) -> None:
    """faust's `_new_offset` (what it commits) after offset 90 is acked and 97 arrived right after 90: stock faust
    commits 98, past 91-97 that nobody processed; the job stage's consumer commits 91."""

    async def committed_after_gap(stock: bool) -> int | None:
        app = build_app(Settings(state_dir=tmp_path, broker=BrokerSettings(enabled=False)), partitions=4)
        consumer = app.consumer
        assert isinstance(consumer, GaplessConsumer)
        add_gap = super(GaplessConsumer, consumer)._add_gap if stock else consumer._add_gap
        consumer._committed_offset[DM] = 90
        await add_gap(DM, 91, 97)
        consumer._acked[DM] = [90, 97]
        consumer._acked_index[DM] = {90, 97}
        return (super(GaplessConsumer, consumer)._new_offset if stock else consumer._new_offset)(DM)

    assert asyncio.run(committed_after_gap(stock=True)) == 98
    assert asyncio.run(committed_after_gap(stock=False)) == 91


def test_the_gapless_consumer_commits_only_a_run_that_starts_at_the_committed_offset(tmp_path: Path) -> None:
    """Committed 252 (the next offset to read), 252 never acked (dropped by faust's fetcher after a seek), 253 and
    254 acked: stock faust commits 255, past 252; the project's consumer commits nothing until 252 is acked."""
    app = build_app(Settings(state_dir=tmp_path, broker=BrokerSettings(enabled=False)), partitions=4)
    consumer = app.consumer
    assert isinstance(consumer, GaplessConsumer)

    def new_offset(stock: bool, acked: list[int], committed: int | None) -> int | None:
        consumer._committed_offset[DM] = committed
        consumer._acked[DM] = list(acked)
        consumer._acked_index[DM] = set(acked)
        new = super(GaplessConsumer, consumer)._new_offset if stock else consumer._new_offset
        return new(DM)

    assert new_offset(True, [253, 254], 252) == 255
    assert new_offset(False, [253, 254], 252) is None
    assert consumer._acked[DM] == [253, 254]  # kept for when 252 is acked
    assert new_offset(False, [254, 252, 253, 257], 252) == 255
    assert consumer._acked[DM] == [257] and consumer._acked_index[DM] == {257}
    assert new_offset(False, [], 252) is None


class NoAnswer(Consumer):
    """A consumer whose fetch position never comes back for the partitions in `unanswered` (a question that
    waits in the consumer thread's call queue behind calls that do not end), and with the given ends."""

    def __init__(self, committed: dict[TP, int], unanswered: set[TP], ends: dict[TP, int]) -> None:
        super().__init__(committed)
        self.unanswered = unanswered
        self.ends = ends

    async def fetch_position(self, tp: TP) -> int | None:
        if tp in self.unanswered:
            await asyncio.Event().wait()
        return await super().fetch_position(tp)

    async def highwaters(self, *tps: TP) -> dict[TP, int]:
        return {tp: self.ends[tp] for tp in tps}

    def assignment(self) -> set[TP]:
        return set(self.ends)


def test_a_position_that_never_comes_holds_up_neither_the_check_nor_the_idle_test(monkeypatch) -> None:
    """A check that waited on it held the agent's lock for good: no batch ran and `chat run --max-idle-s` never
    stopped. Each wait is bounded now: the partition counts as not behind, and the idle test takes it as at its
    end only where what was admitted reaches its end."""
    import streams.agents as agents

    monkeypatch.setattr(agents, "POSITION_WAIT_S", 0.05)
    other = TP(DM.topic, 1)
    consumer = NoAnswer({DM: 52, other: 7}, unanswered={other}, ends={DM: 60, other: 7})
    app = SimpleNamespace(consumer=consumer, rebalancing=False)
    order = InOrder(app)  # type: ignore[arg-type]

    async def scenario() -> None:
        consumer.positions = {DM: 60}
        await asyncio.wait_for(order.check([other, DM]), timeout=2)
        assert order.behind == {(DM.topic, 0)}  # the partition with a position was still checked
        assert order.next_offset[(other.topic, 1)] == 7
        admitted = {(other.topic, 1): 7, (DM.topic, 0): 52}
        # DM fetched to its end but admitted only to 52: records still to come (`caught_up` reads both).
        assert not await asyncio.wait_for(agents.caught_up(app, [DM.topic], admitted), timeout=2)  # type: ignore[arg-type]
        admitted[(DM.topic, 0)] = 60
        # DM fetched and admitted to its end; `other` answers nothing, but what was admitted there reaches its end.
        assert await asyncio.wait_for(agents.caught_up(app, [DM.topic], admitted), timeout=2)  # type: ignore[arg-type]
        consumer.ends[other] = 9  # two records past what was admitted: not at its end
        assert not await asyncio.wait_for(agents.caught_up(app, [DM.topic], admitted), timeout=2)  # type: ignore[arg-type]

    asyncio.run(scenario())


def test_a_start_offset_still_being_asked_is_not_asked_twice(monkeypatch) -> None:
    """The broker's committed offset is slow to come: the check gives up waiting after `POSITION_WAIT_S` and
    the next check waits on the same question instead of asking again (each question holds one of the
    consumer thread's two call workers)."""
    import streams.agents as agents

    monkeypatch.setattr(agents, "POSITION_WAIT_S", 0.05)
    release = asyncio.Event()
    asked: list[TP] = []

    class Slow(Consumer):
        async def committed_offset(self, tp: TP) -> int | None:
            asked.append(tp)
            await release.wait()
            return 40

    consumer = Slow({})
    order = InOrder(SimpleNamespace(consumer=consumer))  # type: ignore[arg-type]

    async def scenario() -> None:
        consumer.positions = {DM: 45}
        await order.check([DM])
        await order.check([DM])
        assert asked == [DM] and (DM.topic, 0) not in order.next_offset
        release.set()
        await order.check([DM])
        assert asked == [DM] and order.next_offset[(DM.topic, 0)] == 40 and order.behind == {(DM.topic, 0)}
        assert not order.asking

    asyncio.run(scenario())


def test_records_admitted_while_a_check_asks_the_start_offset_keep_their_place() -> None:
    """A check with no agent lock around it (the faust broker test's app) asks a partition's start offset while
    the agent admits its first records. The answer came back and overwrote the agent's next offset with the
    start: the check then sought back to it and the records were counted twice (seen: a, b, c, then a, b)."""
    release = asyncio.Event()

    class Slow(Consumer):
        async def committed_offset(self, tp: TP) -> int | None:
            if len(self.seeks) == 0 and not release.is_set():
                await release.wait()
            return self.committed.get(tp)

    consumer = Slow({})
    order = InOrder(SimpleNamespace(consumer=consumer))  # type: ignore[arg-type]

    async def scenario() -> None:
        consumer.positions = {DM: 6}
        check = asyncio.ensure_future(order.check([DM]))
        await asyncio.sleep(0)  # the check is waiting on the start offset
        admitting = asyncio.ensure_future(order.admit(_events(DM, [3, 4, 5])))
        await asyncio.sleep(0)
        release.set()
        assert _offsets(await admitting) == [3, 4, 5]
        await check
        assert order.next_offset[(DM.topic, 0)] == 6 and not order.behind and consumer.seeks == []

    asyncio.run(scenario())


def test_the_fetch_position_is_read_from_aiokafkas_own_subscription_state() -> None:
    """`_known_position` against aiokafka's `SubscriptionState` itself: none before an assignment, none while the
    assigned partition's position is still to be reset, the position once sought; another partition none."""
    from aiokafka.consumer.subscription_state import SubscriptionState
    from aiokafka.structs import TopicPartition

    from streams.agents import _known_position

    async def scenario() -> list[int | None]:
        state = SubscriptionState()
        client = SimpleNamespace(_subscription=state)
        tp = TopicPartition("t.alerts.v1", 0)
        seen = [_known_position(client, tp)]
        state.assign_from_user({tp})
        seen.append(_known_position(client, tp))
        state.seek(tp, 42)
        return [*seen, _known_position(client, tp), _known_position(client, TopicPartition("t.alerts.v1", 1))]

    assert asyncio.run(scenario()) == [None, None, 42, None]


def test_a_batchs_new_partitions_are_asked_their_start_offsets_at_once() -> None:
    tps = [TP("t.usage.device-minutes.v1", p) for p in range(4)]

    class Slow(Consumer):
        """Each question takes a while (behind aiokafka's fetch wait, ~1.5 s each on a real broker)."""

        def __init__(self) -> None:
            super().__init__({})
            self.asking = 0
            self.most_at_once = 0

        async def committed_offset(self, tp: TP) -> int | None:
            self.asking += 1
            self.most_at_once = max(self.most_at_once, self.asking)
            await asyncio.sleep(0.05)
            self.asking -= 1
            return None

    consumer = Slow()
    order = InOrder(SimpleNamespace(consumer=consumer))  # type: ignore[arg-type]
    events = [e for tp in tps for e in _events(tp, [3, 4])]

    async def scenario() -> None:
        assert _offsets(await order.admit(events)) == [3, 4] * 4

    asyncio.run(scenario())
    assert consumer.most_at_once == 4


def test_the_fetch_looks_again_soon_at_which_partitions_it_may_read(tmp_path: Path) -> None:
    """faust waits up to the fetch's 1 s for the partitions it may read when it asked, or sleeps 1 s when it may
    read none (every stream buffer full): a partition resumed meanwhile waited that long. The project's consumer
    asks again within FETCH_RECHECK_S while a partition waits for its buffer to drain, and waits as faust does
    otherwise (an idle agent would wake 20 times a second for nothing)."""
    from streams.agents import FETCH_RECHECK_S

    asked: list[tuple[set[TP], float]] = []

    async def getmany(active_partitions: set[TP], timeout: float) -> dict[TP, list[Any]]:
        asked.append((set(active_partitions), timeout))
        return {}

    async def scenario() -> None:
        app = build_app(Settings(state_dir=tmp_path, broker=BrokerSettings(enabled=False)), partitions=4)
        consumer = app.consumer
        assert isinstance(consumer, GaplessConsumer)
        consumer._getmany = getmany  # type: ignore[method-assign]

        async def waited(stock: bool) -> float:
            wait = super(GaplessConsumer, consumer)._wait_next_records if stock else consumer._wait_next_records
            t0 = asyncio.get_running_loop().time()
            await wait(1.0)
            return asyncio.get_running_loop().time() - t0

        consumer._set_active_tps({DM, JOBS})
        await waited(stock=False)  # no buffer full: faust's wait as it is
        assert asked == [({DM, JOBS}, 1.0)]
        consumer.on_buffer_full(DM)
        consumer.on_buffer_full(JOBS)  # every partition paused: its buffer is full
        assert await waited(stock=True) >= 0.9
        assert await waited(stock=False) < 0.5 and len(asked) == 1
        consumer.on_buffer_drop(JOBS)
        await waited(stock=False)
        assert asked[1:] == [({JOBS}, FETCH_RECHECK_S)]

    asyncio.run(scenario())


def test_the_brokers_hold_on_a_fetch_is_short(tmp_path: Path) -> None:
    """faust builds its aiokafka consumer with fetch_max_wait_ms=1500, and aiokafka keeps one fetch in flight per
    broker: partitions read to the end of what was fetched waited behind a fetch of partitions with nothing new."""
    from streams.agents import FETCH_MAX_WAIT_MS

    async def scenario() -> None:
        app = build_app(Settings(state_dir=tmp_path, broker=BrokerSettings(enabled=False)), partitions=4)
        consumer = app.consumer
        assert isinstance(consumer, GaplessConsumer)
        thread: Any = consumer._new_consumer_thread()
        client = thread._create_worker_consumer(app.transport)
        assert client._fetch_max_wait_ms == FETCH_MAX_WAIT_MS < 1500
        await client.stop()

    asyncio.run(scenario())
