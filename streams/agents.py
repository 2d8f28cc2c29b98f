"""Running a faust app in this process, the project's way (the job stage's agents, the chat and reclaim workers).

Shared by `processors/idle_agents.py` (the job stage) and `sinks/worker_agent.py` (chat, reclaim):

- `broker_options`, `raw_topic`, `FaustDeadLetters`: faust/aiokafka from the project's Kafka settings;
  topics of raw bytes (the project's own UTF-8 keys and Avro values); dead letters on faust's producer.
- `serve_app`: start an app in the running event loop (no `faust.Worker`: its signal handlers would take
  SIGTERM from `base/shutdown.py`), watch the stop request, the caller's idle test and the app's health,
  then stop it within the stop's deadline. `run_loop` runs such a coroutine in a fresh event loop whose
  leftover tasks are given a bounded time to end (a broker that is frozen must not hold the exit).
- `run_replacing`: a crashed app (an agent raised, a commit or a send failed while the broker was away)
  is replaced in-process by a fresh one, with `base.recovery.RecoveryPolicy`, as a restart would.
- `RecordAgent` / `run_record_agent`: one agent over one contract topic, the faust counterpart of
  `streams.consume.ConsumerLoop`: decode-or-dead-letter each record, hand the good ones to a handler (in a
  worker thread, in order), deliver the dead letters, then ack; faust commits what was acked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import faust
from faust.streams import _current_event
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, ensure_aiokafka_TP
from faust.transport.drivers.aiokafka import Consumer as AiokafkaConsumer
from faust.transport.drivers.aiokafka import Producer as AiokafkaProducer
from faust.types import TP
from faust.types.tuples import FutureMessage
from faust.utils.functional import consecutive_numbers
from mode import CrashingSupervisor
from mode.threads import WorkerThread

from base.errors import ServiceError
from base.recovery import RecoveryPolicy
from base.settings import KafkaSettings
from base.shutdown import CLOSE_WAIT_S, budget
from schemas.codec import AvroCodec
from streams.consume import SourceRecord, decode_or_dead_letter

log = logging.getLogger("gpuledger.streams.agents")

S = TypeVar("S")
T = TypeVar("T")
QUIET_CHECK_S = 0.1  # how often `serve_app` looks at the stop request, the idle test and the app's health
LEFTOVER_WAIT_S = 2.0  # the longest the tasks an app left behind get to end once it stopped
RESEEK_AFTER_S = 1.0  # a partition still skipping this long after its seek back is sought back again
POSITION_WAIT_S = 5.0  # the longest `InOrder.check` and `caught_up` wait on one offset or position call
DELIVERY_TIMEOUT_S = 120.0  # the longest `IdempotentProducer.delivered` waits for the broker
FETCH_RECHECK_S = 0.05  # while a partition waits for its stream buffer to drain: how often a fetch looks again
FETCH_MAX_WAIT_MS = 100  # the longest the broker holds a fetch with no data for it (faust: 1,500)


def raw_topic(app: faust.App, *names: str, **options: Any) -> faust.TopicT:
    """A topic of raw bytes: keys and values are the project's own (UTF-8 keys, Avro or JSON values)."""
    return app.topic(*names, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw", **options)


class IdempotentProducer(AiokafkaProducer):
    """faust's aiokafka producer with `acks=all` and idempotence always on (faust turns idempotence on only
    inside transactions): a send retried after a leader change is not written twice, as `base/kafka.py`'s
    producers."""

    def _settings_extra(self) -> Mapping[str, Any]:
        return {**super()._settings_extra(), "acks": "all", "enable_idempotence": True}

    def __post_init__(self) -> None:
        super().__post_init__()
        self.in_flight: set[FutureMessage] = set()  # handed to `send_soon`, not yet delivered or failed

    def send_soon(self, fut: FutureMessage) -> None:
        self.in_flight.add(fut)
        fut.add_done_callback(self.in_flight.discard)
        super().send_soon(fut)

    async def delivered(self, timeout_s: float = DELIVERY_TIMEOUT_S) -> None:
        """Every message handed to `send_soon` so far (outputs, dead letters, a Table's changelog writes) is
        on the broker, or this raises. faust's `flush` is not that: it returns once no message left its
        buffer for 0.1 s (a send waiting for metadata after a restart), and one the buffer task already took
        is in neither queue; inputs acked after it could commit ahead of what they produced."""
        in_flight = self.in_flight
        await self.flush()  # hands the buffer to aiokafka now rather than waiting for the buffer task
        deadline = time.monotonic() + timeout_s
        while in_flight:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServiceError(f"{len(in_flight)} sent records not delivered within {timeout_s:.0f} s")
            done, _ = await asyncio.wait(list(in_flight), timeout=left)
            for fut in done:
                fut.result()  # a delivery that failed raises here: the agent crashes, a restart replays


class PromptFetchThread(AIOKafkaConsumerThread):
    """faust's consumer thread, its aiokafka consumer's fetches held by the broker at most FETCH_MAX_WAIT_MS. faust
    asks for 1,500 ms, and aiokafka has one fetch in flight per broker: while one waited for records of partitions
    with nothing new (the job events), partitions it had just read to the end of their fetched records were not
    asked again (the job stage sat ~0.5-1.5 s with device-minutes unread, in a minute's burst)."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # read by its fetcher, made when it starts
        return consumer


class GaplessConsumer(AiokafkaConsumer):
    """faust's aiokafka consumer without its offset-gap bookkeeping. When a record's offset is more than one past
    the last one it read, faust takes the difference for a hole in the log (compaction, transaction markers) and
    counts it, the record after it included, as acked. The project's topics have no such holes; what faust sees
    as one is its own delivery skipping records around a seek (seen in the fault suite: after an assignment, a
    partition's offsets 52 to 89, then 495), and acking those commits input that was never processed.

    Nor does it wait a second to read a partition again once its stream's buffer drained. faust stops fetching a
    partition whose buffer is full and resumes it when the buffer is half empty, but a fetch already waiting (up
    to 1 s, for the partitions still fetched then), or its 1 s sleep when none is, ends first. In a minute's burst
    of 100,000 device-minutes the job stage sat idle ~1.2 s that way, twice a minute, with its input unread on
    the broker (idle alerts waited on it)."""

    def _new_consumer_thread(self) -> PromptFetchThread:
        return PromptFetchThread(self, loop=self.loop, beacon=self.beacon)

    async def _add_gap(self, tp: TP, offset_from: int, offset_to: int) -> None:
        return None

    async def _wait_next_records(self, timeout: float) -> tuple[Any, set[TP] | None]:
        if not self._buffered_partitions:  # none waits for its buffer to drain: faust's wait loses nothing
            return await super()._wait_next_records(timeout)
        if self.flow_active and not self.app.client_only and not self._get_active_partitions():
            await self.sleep(FETCH_RECHECK_S)  # every partition's buffer is full: look again soon
            return {}, set()
        return await super()._wait_next_records(min(timeout, FETCH_RECHECK_S))

    def _new_offset(self, tp: TP) -> int | None:
        """What to commit for `tp`: the acked run that starts at the committed offset, else nothing. faust's
        own commits the first run of acked offsets wherever it starts when it has no committed offset on
        record (none yet, or 0), and lets one missing record at the head pass when it has (its test is
        `min(acked) - committed > 1`, while the committed offset is the next one to read): either way an
        offset never acked, as a record faust's fetcher dropped after a seek, would be committed past."""
        acked = self._acked[tp]
        if not acked:
            return None
        acked.sort()
        committed = self._committed_offset[tp]
        if committed is not None and acked[0] != committed:
            return None  # the record at the committed offset is not acked yet
        run = next(consecutive_numbers(acked))
        acked[: len(run)] = []
        self._acked_index[tp].difference_update(run)
        return int(run[-1]) + 1

    async def committed_offset(self, tp: TP) -> int | None:
        """The group's committed offset of `tp`, asked of the broker. faust's own record of it
        (`_committed_offset`) is filled by its seek after an assignment, and records can arrive before that
        seek ends: read then, a restarted worker took its partitions for never committed and read them again
        from the earliest offset."""
        thread: Any = self._thread
        client = thread._ensure_consumer()
        offset = await thread.call_thread(client.committed, ensure_aiokafka_TP(tp))
        return None if offset is None else int(offset)

    async def fetch_position(self, tp: TP) -> int | None:
        """The partition's fetch position, None while it has none (assigned, its reset not done yet) or is not
        assigned. aiokafka's `position` waits instead, as long as that lasts, and holds one of the consumer
        thread's two call workers meanwhile: the fetches go through the same two."""
        thread: Any = self._thread
        client = thread._ensure_consumer()
        return cast(int | None, await thread.call_thread(_known_position, client, ensure_aiokafka_TP(tp)))


def _known_position(client: Any, tp: Any) -> int | None:
    subscription = client._subscription.subscription
    assignment = None if subscription is None else subscription.assignment
    if assignment is None or tp not in assignment.tps:
        return None
    state = assignment.state_value(tp)
    return int(state.position) if state.has_valid_position else None


class InOrder:
    """Admits a batch's records only where they continue their partition exactly. faust can deliver a partition
    from two positions around a seek (after an assignment: offsets 52 to 89, then 495), and it drops records it
    fetched without a word: those of a partition paused for recovery, the rest of a fetch when a rebalance
    starts, those below a partition's read offset after a seek. State built on a skip would count records as
    read that never were. A record already admitted is dropped; a skip is dropped and its partition sought back
    to its next offset, so the skipped records come again. An agent that holds records unacked across batches
    needs this; one that acks each batch whole does not (a skip there stalls the commit).

    A dropped run at a partition's end has no later record to show it, and a seek back can come to nothing
    (records fetched before it move faust's read offset past the ones sought). So `check` compares, every
    `RESEEK_AFTER_S`, each partition's next offset with the consumer's fetch position: a partition fetched past
    what was admitted is `behind` (input still to come, for an agent's idle test), and sought back once it
    made no progress for `RESEEK_AFTER_S`."""

    def __init__(self, app: faust.App) -> None:
        self.app = app
        self.next_offset: dict[tuple[str, int], int] = {}  # by (topic, partition)
        self.sought: dict[tuple[str, int], tuple[int, float]] = {}  # the last seek back: offset, when
        self.behind: set[tuple[str, int]] = set()  # fetched or seen past the next offset, not admitted yet
        self.waiting: dict[tuple[str, int], tuple[int, float]] = {}  # behind since: next offset, when
        self.seeks_back = 0
        self.asking: dict[tuple[str, int], asyncio.Task[int]] = {}  # start offsets asked and not answered yet

    def forget(self, *keys: tuple[str, int]) -> None:
        """Revoked partitions: the next assignment starts them from their committed offsets."""
        for key in keys:
            self.next_offset.pop(key, None)
            self.sought.pop(key, None)
            self.behind.discard(key)
            self.waiting.pop(key, None)
            self.asking.pop(key, None)

    async def admit(self, events: Sequence[Any], unordered: str | None = None) -> list[Any]:
        """`events` less the ones out of order (records of the topic `unordered` all pass)."""
        out: list[Any] = []
        skipped: dict[tuple[str, int], TP] = {}
        new: dict[tuple[str, int], TP] = {}
        for event in events:
            msg = event.message
            if msg.topic != unordered and (msg.topic, msg.partition) not in self.next_offset:
                new[(msg.topic, msg.partition)] = msg.tp
        if new:  # asked of the broker all at once (each can take a fetch wait); a concurrent `check` that set
            # one meanwhile wins
            starts = await asyncio.gather(*(start_offset(self.app.consumer, tp) for tp in new.values()))
            for key, start in zip(new, starts, strict=True):
                self.next_offset.setdefault(key, start)
        for event in events:
            msg = event.message
            if msg.topic == unordered:
                out.append(event)
                continue
            key = (msg.topic, msg.partition)
            nxt = self.next_offset[key]
            if msg.offset == nxt:
                self.next_offset[key] = nxt + 1
                out.append(event)
            elif msg.offset > nxt:
                skipped[key] = msg.tp
        for key, tp in skipped.items():
            self.behind.add(key)
            await self._seek_back(key, tp)
        return out

    def keep_checked(self, topics: Collection[str], lock: asyncio.Lock | None = None) -> None:
        """Runs `check` every `RESEEK_AFTER_S` over the assigned partitions of `topics` (under `lock`, the
        agent's, when given): without it a record dropped at a partition's end is never read again. Once per
        app, before it starts."""
        app = self.app

        @app.timer(RESEEK_AFTER_S)
        async def check_order() -> None:
            if app.rebalancing:
                return
            async with lock if lock is not None else contextlib.nullcontext():
                await self.check([tp for tp in app.consumer.assignment() if tp.topic in topics])

    async def check(self, tps: Iterable[TP]) -> None:
        """Each of `tps` (assigned partitions this admits) fetched past its next offset is `behind`; one behind
        with no progress for `RESEEK_AFTER_S` is sought back."""
        consumer: Any = self.app.consumer
        now = time.monotonic()
        for tp in tps:
            key = (tp.topic, tp.partition)
            nxt = self.next_offset.get(key)
            if nxt is None:
                start = await self._asked(key, start_offset(consumer, tp), f"{tp.topic}[{tp.partition}]'s start offset")
                if start is None:
                    continue
                nxt = self.next_offset.setdefault(key, start)  # records admitted while it was asked keep theirs
            # No position yet (aiokafka is still resetting it): nothing was fetched past the next offset.
            position = await fetch_position(consumer, tp)
            if position is None or position <= nxt:
                self.behind.discard(key)
                self.waiting.pop(key, None)
                continue
            self.behind.add(key)
            since = self.waiting.get(key)
            if since is None or since[0] != nxt:
                self.waiting[key] = (nxt, now)  # progress since the last check: records may still be on the way
            elif now - since[1] >= RESEEK_AFTER_S:
                await self._seek_back(key, tp)

    async def _asked(self, key: tuple[str, int], call: Coroutine[Any, Any, int], what: str) -> int | None:
        """`answered`, but a question still open from an earlier check is waited on again, not asked twice."""
        task = self.asking.get(key)
        if task is None:
            task = self.asking[key] = asyncio.ensure_future(call)
        else:
            call.close()
        try:
            return await answered(asyncio.shield(task), what)
        finally:
            if task.done():  # answered, or failed (raised here once; the next check asks afresh)
                self.asking.pop(key, None)

    async def _seek_back(self, key: tuple[str, int], tp: TP) -> None:
        nxt = self.next_offset.get(key)
        if nxt is None:  # revoked while an earlier seek was awaited: the next assignment starts it afresh
            return
        now = time.monotonic()
        last = self.sought.get(key)
        if last is not None and last[0] == nxt and now - last[1] < RESEEK_AFTER_S:
            return  # records fetched before that seek are still arriving
        self.sought[key] = (nxt, now)
        self.seeks_back += 1
        log.warning("%s[%d]: records from %d were skipped by the consumer: reading again from there", *key, nxt)
        await self.app.consumer.seek_wait({tp: nxt})


async def start_offset(consumer: Any, tp: TP) -> int:
    """Where a newly assigned partition starts: the group's committed offset, else the earliest one the broker
    holds (the consumer's `auto_offset_reset`)."""
    committed = await consumer.committed_offset(tp)
    if committed is not None:
        return int(committed)
    earliest = await consumer.earliest_offsets(tp)
    return int(earliest.get(tp) or 0)


async def answered(call: Awaitable[T], what: str) -> T | None:
    """`call`'s answer, or None (logged) after `POSITION_WAIT_S`. The order check and the idle test ask under the
    agent's lock or in the serving loop, where a question that never came back would hold up every batch and
    the stop."""
    try:
        return await asyncio.wait_for(call, POSITION_WAIT_S)
    except TimeoutError:
        log.warning("%s: no answer within %.0f s; asked again at the next check", what, POSITION_WAIT_S)
        return None


def use_project_clients(app: faust.App) -> None:
    """The app's producer idempotent (`IdempotentProducer`), its consumer without gap acks (`GaplessConsumer`);
    before either is built."""
    app.transport.Producer = IdempotentProducer  # type: ignore[misc]
    app.transport.Consumer = GaplessConsumer  # type: ignore[misc]


async def delivered(app: faust.App) -> None:
    """`IdempotentProducer.delivered` of the app's producer (every project app uses one)."""
    wait = getattr(app.producer, "delivered", None)
    if wait is None:
        raise TypeError(f"{app.conf.id}: the producer is {type(app.producer).__name__}, not IdempotentProducer")
    await wait()


def broker_options(kafka: KafkaSettings) -> dict[str, Any]:
    """faust/aiokafka connection options from the project's librdkafka-style Kafka settings."""
    conf = kafka.client_config()
    urls = ";".join(f"kafka://{h.strip()}" for h in conf["bootstrap.servers"].split(",") if h.strip())
    opts: dict[str, Any] = {"broker": urls}
    proto = conf.get("security.protocol", "PLAINTEXT").upper()
    context = None
    if proto in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=conf.get("ssl.ca.location"))
    if proto.startswith("SASL_"):
        opts["broker_credentials"] = faust.SASLCredentials(
            username=conf.get("sasl.username"),
            password=conf.get("sasl.password"),
            mechanism=conf.get("sasl.mechanism", "PLAIN"),
            ssl_context=context,
        )
    elif context is not None:
        opts["broker_credentials"] = faust.SSLCredentials(context)
    return opts


class FaustDeadLetters:
    """`streams.consume.DeadLetterSink` on faust's producer (buffered: flushed before the offsets are acked)."""

    def __init__(self, app: faust.App) -> None:
        self.app = app

    def publish_raw(self, topic_name: str, key: bytes | None, value: bytes | None, headers: Any = None) -> None:
        raw_topic(self.app, topic_name).send_soon(key=key, value=value or b"", headers=headers)


async def fetch_position(consumer: Any, tp: TP) -> int | None:
    """`GaplessConsumer.fetch_position` of `tp`, None also when no answer came within `POSITION_WAIT_S`."""
    return await answered(
        cast(GaplessConsumer, consumer).fetch_position(tp), f"{tp.topic}[{tp.partition}]'s fetch position"
    )


async def fetched(app: faust.App, tps: Sequence[TP]) -> tuple[Mapping[TP, int], dict[TP, int | None]] | None:
    """The high watermarks of `tps` and the consumer's fetch position in each (None: none yet, or no answer);
    None when the watermarks did not come within `POSITION_WAIT_S`."""
    ends = await answered(app.consumer.highwaters(*tps), "the high watermarks")
    if ends is None:
        return None
    return ends, {tp: await fetch_position(app.consumer, tp) for tp in tps}


async def caught_up(app: faust.App, topics: Sequence[str], admitted: Mapping[tuple[str, int], int]) -> bool:
    """Every assigned partition of `topics` read to its end: the fetch position at the high watermark and, where
    the agent admits in order, the next offset `admitted` there too (records fetched after a seek back sit in
    faust's buffer, not admitted yet: an agent that stopped then lost them for that life). Fetched is not
    processed: a caller checks too that its agent saw no input meanwhile, and long enough."""
    tps = [tp for tp in app.consumer.assignment() if tp.topic in topics]
    if not tps or app.rebalancing:
        return False
    read = await fetched(app, tps)
    if read is None:
        return False
    ends, positions = read
    for tp in tps:
        pos, done = positions[tp], admitted.get((tp.topic, tp.partition))
        if done is not None:  # admitted in order: at its end once both what was fetched and what was admitted are
            pos = done if pos is None else min(pos, done)
        if pos is None or pos < ends.get(tp, 0):
            return False
    return True


class InputClock(Protocol):
    """What the idle test (`drained`) reads of an agent: when its input last arrived (monotonic seconds,
    set when a batch arrives and by `drained` while the app is not ready), how many batches it finished,
    and whether one is in hand."""

    last_input: float

    @property
    def order(self) -> InOrder | None:
        """What was admitted and what is behind; None for an agent that acks whole batches."""

    @property
    def batches(self) -> int: ...

    @property
    def busy(self) -> bool: ...


async def drained(app: faust.App, clock: InputClock, topics: Sequence[str], quiet_s: float, ready: bool) -> bool:
    """The idle test of `--exit-when-idle` / `--max-idle-s`: no input for `quiet_s`, no batch in hand, every
    assigned partition of `topics` fetched to its end, and no batch arriving or finishing while the ends
    were read (fetched is not processed). Starting, joining and rebalancing (`ready` False) are not quiet:
    the quiet time counts from when the app is ready."""
    now = time.monotonic()
    if not ready:
        clock.last_input = now
        _say_why_not_idle(app, clock, now, "not ready: starting, joining or rebalancing")
        return False
    seen, batches = clock.last_input, clock.batches
    if clock.busy:
        behind = sorted(clock.order.behind) if clock.order is not None else []
        _say_why_not_idle(app, clock, now, f"busy: a batch in hand, or partitions behind {behind}")
        return False
    if now - seen < quiet_s:
        return False
    if not await caught_up(app, topics, clock.order.next_offset if clock.order is not None else {}):
        _say_why_not_idle(app, clock, now, "not read to the end yet")
        return False
    return clock.last_input == seen and clock.batches == batches and not clock.busy


NOT_IDLE_SAY_EVERY_S = 30.0
_not_idle_said: dict[int, float] = {}


def _say_why_not_idle(app: faust.App, clock: InputClock, now: float, why: str) -> None:
    """Every `NOT_IDLE_SAY_EVERY_S`, why an agent waiting to be idle is not (a run that never ends says why); when
    busy, where each task of the event loop waits (what holds a batch or the agent's lock)."""
    if now - _not_idle_said.setdefault(id(clock), now) >= NOT_IDLE_SAY_EVERY_S:
        _not_idle_said[id(clock)] = now
        log.info("%s: not idle: %s; %d batches", app.conf.id, why, clock.batches)
        if why.startswith("busy"):
            log.info("%s: the event loop's tasks, each where it waits:\n%s", app.conf.id, "\n".join(task_stacks()))


def task_stacks() -> list[str]:
    """Each task of the running loop and the chain of awaits it is suspended in, innermost last."""
    lines: list[str] = []
    for task in asyncio.all_tasks():
        chain: list[str] = []
        obj: Any = task.get_coro()
        while obj is not None and len(chain) < 40:
            frame = getattr(obj, "cr_frame", None) or getattr(obj, "ag_frame", None) or getattr(obj, "gi_frame", None)
            if frame is None:
                chain.append(repr(obj)[:160])
                break
            chain.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno})")
            obj = getattr(obj, "cr_await", None) or getattr(obj, "ag_await", None) or getattr(obj, "gi_yieldfrom", None)
        lines.append(f"{task.get_name()}: " + " -> ".join(chain))
    return lines


async def serve_app(
    app: faust.App,
    stop: Callable[[], bool],
    *,
    idle: Callable[[bool], Awaitable[bool]] | None = None,
    tick: Callable[[], Awaitable[None]] | None = None,
) -> BaseException | None:
    """Start `app` in this event loop, run it until `stop()`, `idle(ready)` or a crash, then stop it (its last
    commit) within `stop`'s deadline when it is a `base.shutdown.StopSignal`. `tick` runs every check
    (stats files, lag); `idle` too, with `ready` False while the app is starting, joining its group or
    rebalancing (time that is not quiet input, see `drained`). Returns why the app crashed, or None."""
    app.in_worker = True
    starting = asyncio.ensure_future(app.start())
    crashed: BaseException | None = None
    try:
        while not stop():
            await asyncio.sleep(QUIET_CHECK_S)
            if starting.done() and starting.exception() is not None:
                crashed = starting.exception()
                break
            if app.crashed or (starting.done() and app.should_stop):
                crashed = app.crash_reason or ServiceError("the faust app stopped by itself")
                break
            if tick is not None:
                await tick()
            if idle is not None:
                ready = starting.done() and bool(app.consumer.assignment()) and not app.rebalancing
                if await idle(ready):
                    break
    finally:
        if not starting.done():
            # A start cut short can leave faust's consumer thread running after the stop, and the process then
            # cannot exit (seen: a SIGTERM 0.2 s into a start, abandoned by the watchdog). Let it finish first.
            try:
                await asyncio.wait_for(asyncio.shield(starting), timeout=max(0.1, budget(stop, CLOSE_WAIT_S) / 2))
            except Exception:
                starting.cancel()
        # Stopping commits what was acked (after flushing the producer: outputs and dead letters first).
        try:
            await asyncio.wait_for(app.stop(), timeout=max(0.1, budget(stop, CLOSE_WAIT_S)))
        except TimeoutError:
            abandon = getattr(stop, "abandon", None)
            if abandon is not None:
                abandon(f"the faust app {app.conf.id}'s stop (its last commit)")
            else:
                log.warning("%s: stopping without its last commit (replayed at the next start)", app.conf.id)
    return crashed


def run_loop(main: Awaitable[S], stop: Callable[[], bool]) -> S:
    """`asyncio.run(main)`, but the tasks a stopped app leaves behind (a connection to a frozen broker)
    get at most `LEFTOVER_WAIT_S` (less once stopping) to end instead of an unbounded wait."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # as asyncio.run does
    try:
        return loop.run_until_complete(main)
    finally:
        asyncio.set_event_loop(None)
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.wait(tasks, timeout=max(0.1, budget(stop, LEFTOVER_WAIT_S))))
        # A stop given up on (a frozen broker) leaves faust's consumer thread running: it calls back into
        # this loop when it ends, which raises in that thread once the loop is closed. Left open, the call
        # is simply never run; the loop goes with the process (or the garbage collector).
        if not any(isinstance(t, WorkerThread) and t.is_alive() for t in threading.enumerate()):
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


class AppFailed(ServiceError):
    """A faust app crashed: `run_replacing` builds a fresh one, which resumes from the committed offsets."""

    def __init__(self, what: str, cause: BaseException, stats: Any) -> None:
        super().__init__(f"the {what} failed: {cause!r}")
        self.stats = stats


def run_replacing(
    run_once: Callable[[], S],
    stop: Callable[[], bool],
    add: Callable[[S, S], S],
    empty: S,
    policy: RecoveryPolicy | None = None,
) -> S:
    """`run_once()` until it returns (stopped or idle); when it raises `AppFailed`, run it again after
    `policy`'s backoff (a stop cuts the wait short), as a restart would, adding up the failed runs' stats.
    Raises `ServiceError` once the policy gives up."""
    policy = policy or RecoveryPolicy()
    failures: list[float] = []
    carried = empty
    while True:
        try:
            return add(carried, run_once())
        except AppFailed as exc:
            now = time.monotonic()
            failures.append(now)
            carried = add(carried, exc.stats)
            delay = policy.delay(failures, now)
            if delay is None:
                raise ServiceError(f"{exc}; {policy.recent(failures, now)} failures within "
                                   f"{policy.window_s:.0f} s, giving up") from exc  # fmt: skip
            log.warning("%s; a fresh app in %.1f s, from the committed offsets", exc, delay)
            end = time.monotonic() + delay
            while not stop() and time.monotonic() < end:
                time.sleep(0.1)
            if stop():
                return carried


# ------------------------------------------------------------------------------------------------ one topic
@dataclass(slots=True)
class RecordStats:
    handled: int = 0  # decoded, validated and handed to the handler
    dead_lettered: int = 0  # undecodable or invalid, on `<topic>.dlq`
    batches: int = 0


def _add(a: RecordStats, b: RecordStats) -> RecordStats:
    return RecordStats(a.handled + b.handled, a.dead_lettered + b.dead_lettered, a.batches + b.batches)


TAKE_MAX = 500  # records per batch (as `ConsumerLoop`)
TAKE_WITHIN_S = 0.5  # the longest a batch waits to fill (as `ConsumerLoop`)
LAG_REFRESH_S = 2.0


class RecordAgent:
    """One agent over one contract topic (or a few, each with its handler): decode or dead-letter, handle in
    order, flush, ack.

    At least once, as `ConsumerLoop`: a batch is acked only once every record of it was handled and its
    dead letters were delivered (the producer flushed), and faust commits only acked offsets, so a crash
    or a stop anywhere before replays the batch. The handler is synchronous (ClickHouse, HTTP, scheduler
    commands): it runs in one worker thread, one record at a time, so the event loop keeps the group's
    heartbeats going while it waits. faust's current event is cleared first: a send made inside an
    event is otherwise held back until that event's offset commits (see `processors/idle_agents.py`).

    Records are admitted in offset order (`InOrder`), as the job stage's: faust drops fetched records without a
    word, and a record skipped here would be an alert never posted or a reclaim never run (its commit stalled
    at it until a restart). A skipped partition is sought back and its records come again."""

    def __init__(
        self,
        kafka: KafkaSettings,
        app: faust.App,
        topic_name: str,
        handle: Callable[[dict[str, Any]], Any],
        *,
        meter: Any = None,
        out_label: str = "handled",
        codec: AvroCodec | None = None,
        more: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
    ) -> None:
        self.app = app
        self.topic_name = topic_name
        self.prefix = kafka.topic_prefix
        self.codec = codec or AvroCodec.from_settings(kafka)
        self.dead_letters: Any = FaustDeadLetters(app)
        self.handle = handle
        # `more`: other topics (broker-side names) read by the same agent, each into its own handler (the chat
        # worker reads alerts and appeals); one batch may mix them, handled in the order they came.
        self.handlers = {topic_name: handle, **(more or {})}
        self.meter = meter
        self.out_label = out_label
        self.source = raw_topic(app, *self.handlers)
        self.stats = RecordStats()
        self.last_input = time.monotonic()
        self.order: InOrder | None = InOrder(app)
        self.lock = asyncio.Lock()  # admission: a batch, or the order check (`InOrder.keep_checked`), one at a time
        self.in_hand = 0  # batches arrived and not yet handled and acked (`busy`); the order check is not one
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{app.conf.id}-handler")
        self._next_lag = 0.0

    @property
    def batches(self) -> int:
        return self.stats.batches

    @property
    def busy(self) -> bool:
        """A batch in hand, or records skipped and still to come (`drained`: input is not over). Not the order
        check holding the lock: it reads no input, and counted as busy it kept `chat run --max-idle-s` from ever
        stopping (`drained` wants the agent not busy both before and after it reads the ends)."""
        return self.in_hand > 0 or bool(self.order is not None and self.order.behind)

    async def process(self, stream: Any, events: list[Any]) -> None:
        self.in_hand += 1
        self.last_input = time.monotonic()
        try:
            async with self.lock:
                if self.order is not None:
                    events = await self.order.admit(events)
                await self._process(stream, events)
        finally:
            self.in_hand -= 1

    async def _process(self, stream: Any, events: list[Any]) -> None:
        """Handle the admitted `events`, then ack them (only them: a skipped record is not acked, it comes again)."""
        _current_event.set(None)
        loop = asyncio.get_running_loop()
        handled = 0
        for event in events:
            source = SourceRecord.of(event.message)
            record = decode_or_dead_letter(source, self.codec, self.dead_letters, topic_prefix=self.prefix)
            if record is None:  # already on <topic>.dlq with the reason
                self.stats.dead_lettered += 1
                log.warning("dead-lettered %s[%d]@%d: it does not decode or validate",
                            source.topic, source.partition, source.offset)  # fmt: skip
                continue
            await loop.run_in_executor(self.pool, self.handlers.get(source.topic, self.handle), record)
            handled += 1
            self.stats.handled += 1
        await delivered(self.app)  # the dead letters delivered before the batch is acked
        for event in events:
            await stream.ack(event)
        self.stats.batches += 1
        if self.meter is not None:
            for name in self.handlers:
                arrived = sum(1 for event in events if event.message.topic == name)
                if arrived:
                    self.meter.records_in(name, arrived)
            self.meter.records_out(self.out_label, handled)

    async def idle_for(self, seconds: float, ready: bool) -> bool:
        """Nothing read for `seconds` once ready, no batch in hand, the topic read to its end (`drained`)."""
        return await drained(self.app, self, list(self.handlers), seconds, ready)

    async def refresh_lag(self) -> None:
        """Lag per topic (high watermark less position over the assigned partitions), every `LAG_REFRESH_S`."""
        now = time.monotonic()
        if self.meter is None or now < self._next_lag:
            return
        self._next_lag = now + LAG_REFRESH_S
        lags: dict[str, int] = {}
        try:
            for name in self.handlers:
                tps = [tp for tp in self.app.consumer.assignment() if tp.topic == name]
                read = await fetched(self.app, tps) if tps else ({}, {})
                if read is None:
                    return  # no lag known: at the next refresh
                ends, positions = read
                # a partition with no position yet adds no lag
                lags[name] = sum(max(0, ends.get(tp, 0) - pos) for tp, pos in positions.items() if pos is not None)
        except Exception:  # not started, or between rebalances: at the next refresh
            return
        for name, lag in lags.items():
            self.meter.set_lag(str(self.app.conf.id), name, lag)


def build_record_app(
    kafka: KafkaSettings,
    group_id: str,
    topic_name: str,
    handle: Callable[[dict[str, Any]], Any],
    *,
    datadir: str,
    commit_interval_s: float = 1.0,
    meter: Any = None,
    out_label: str = "handled",
    dead_letters: Callable[[Any], Any] | None = None,
    more: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
) -> tuple[faust.App, RecordAgent]:
    """A faust app (id and consumer group `group_id`) with one agent reading `topic_name` into `handle` (and
    each topic of `more` into its handler).
    It declares no topic (`topic_allow_declare=False`), has no table (no changelog topic) and no
    leader-assignor topic (`topic_disable_leader`): it needs READ on the topic and on its group, WRITE on
    `<topic>.dlq`, nothing more. `dead_letters` may wrap the dead-letter sink (metrics)."""
    app = faust.App(
        group_id,
        **broker_options(kafka),
        store="memory://",
        datadir=datadir,  # faust makes its data directory even with nothing stored: a temporary one
        web_enabled=False,
        autodiscover=False,
        agent_supervisor=CrashingSupervisor,  # an agent that fails stops the app: a fresh one replays its batch
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=10,
        broker_heartbeat_interval=1,
        broker_commit_interval=commit_interval_s,
        producer_acks=-1,
        producer_linger=0.005,
        topic_replication_factor=1,
        stream_wait_empty=False,  # a stop does not wait for a batch being handled: it is replayed
        topic_disable_leader=True,
        topic_allow_declare=False,
    )
    use_project_clients(app)
    agent = RecordAgent(kafka, app, topic_name, handle, meter=meter, out_label=out_label, more=more)
    if dead_letters is not None:
        dead_letters(agent.dead_letters)

    @app.agent(agent.source, concurrency=1, name="records")
    async def records(stream: Any) -> None:
        stream.enable_acks = False  # as the job stage's: no ack of records a stop finds in noack_take's buffer
        async for events in stream.noack_take(TAKE_MAX, within=TAKE_WITHIN_S):
            await agent.process(stream, list(events))

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        revoked = args[0] if args else kwargs.get("revoked", ())
        if agent.order is not None:
            agent.order.forget(*((tp.topic, tp.partition) for tp in revoked))

    if agent.order is not None:
        agent.order.keep_checked(list(agent.handlers), agent.lock)
    return app, agent


def run_record_agent(
    kafka: KafkaSettings,
    group_id: str,
    topic_name: str,
    handle: Callable[[dict[str, Any]], Any],
    stop: Callable[[], bool],
    *,
    max_idle_s: float | None = None,
    commit_interval_s: float = 1.0,
    meter: Any = None,
    out_label: str = "handled",
    dead_letters: Callable[[Any], Any] | None = None,
    policy: RecoveryPolicy | None = None,
    more: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
) -> RecordStats:
    """Handle every record of `topic_name` (broker-side name; and of each topic of `more`, with its handler)
    until `stop()` or, when given, `max_idle_s` without a record once the topics are read to their end; a
    crashed app is replaced in-process."""

    async def serve(datadir: str) -> RecordStats:
        app, agent = build_record_app(
            kafka, group_id, topic_name, handle, datadir=datadir, commit_interval_s=commit_interval_s,
            meter=meter, out_label=out_label, dead_letters=dead_letters, more=more,
        )  # fmt: skip
        idle = None if max_idle_s is None else (lambda ready: agent.idle_for(max_idle_s, ready))
        try:
            crashed = await serve_app(app, stop, idle=idle, tick=agent.refresh_lag)
        finally:
            agent.pool.shutdown(wait=False, cancel_futures=True)  # a handler still running finishes on its own
        if crashed is not None:
            raise AppFailed(f"{group_id} agent", crashed, agent.stats)
        return agent.stats

    def run_once() -> RecordStats:
        with tempfile.TemporaryDirectory(prefix="gpuledger-faust-") as datadir:
            result = run_loop(serve(datadir), stop)
        return result

    return run_replacing(run_once, stop, _add, RecordStats(), policy)
