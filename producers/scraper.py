"""The DCGM producer: scrape many dcgm-exporter endpoints at 1 Hz and publish one record per node scrape.

One asyncio task per target, each with its own keep-alive `httpx.AsyncClient`. Each target scrapes on whole-second
ticks plus a fixed per-target offset (jitter, so hundreds of targets do not hit the network in the
same millisecond), with a per-request timeout; a target that fails backs off exponentially (up to
`backoff_max_s`) and is retried, never dropped. The record's `ts_ms` is the tick the scrape was
made for (event time, whole seconds plus the target's offset). Parsing, mapping and record
building are `producers.dcgm` (pure); publishing goes through `streams.publish.RecordPublisher`.

An endpoint is untrusted: a scrape bigger than `max_scrape_bytes` (declared or streamed) is refused
without reading the rest, and one bigger than `OFFLOAD_BYTES` is parsed in a worker thread so the
event loop keeps every other target on its tick. Either failure counts against that target only.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
import yaml

from base.errors import ConfigError, GpuledgerError, ParseError
from producers.dcgm import ExpositionParser, Normalizer, scrape_record
from schemas.topics import DEVICE_SAMPLES, Topic, node_key

log = logging.getLogger(__name__)


class Publisher(Protocol):
    def publish(self, topic: Topic, key: bytes, record: dict[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class Target:
    """One dcgm-exporter endpoint. `node` defaults to the exporter's Hostname label, else the URL host."""

    url: str
    node: str | None = None
    exporter_version: str | None = None


def parse_targets(text: str, origin: str = "targets") -> list[Target]:
    """Targets from YAML: a list of URLs or {url, node, exporter_version} maps, or
    `{url_template: "http://{node}:9400/metrics", nodes: [...], exporter_version: ...}` (nodes from an inventory)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ParseError(f"{origin}: not YAML: {exc}") from exc
    if isinstance(data, dict) and "targets" in data:
        data = data["targets"]
    items = data if isinstance(data, list) else [data]
    out: list[Target] = []
    for n, item in enumerate(items):
        if isinstance(item, str):
            out.append(Target(item))
        elif isinstance(item, dict) and "url" in item:
            out.append(Target(str(item["url"]), item.get("node"), item.get("exporter_version")))
        elif isinstance(item, dict) and "url_template" in item:
            for node in item.get("nodes", []):
                out.append(Target(str(item["url_template"]).format(node=node), str(node), item.get("exporter_version")))
        else:
            raise ParseError(f"{origin}: entry {n}: expected a URL, {{url: ...}} or {{url_template, nodes}}: {item!r}")
    for t in out:
        if not t.url.startswith(("http://", "https://")):
            raise ConfigError(f"{origin}: {t.url!r} is not an http(s) URL")
    return out


@dataclass(slots=True)
class TargetState:
    failures: int = 0
    retry_at: float = 0.0
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    last_error: str | None = None


@dataclass(slots=True)
class ScrapeStats:
    ok: int = 0
    failed: int = 0
    records: int = 0
    devices: int = 0
    missed_ticks: int = 0
    targets: dict[str, TargetState] = field(default_factory=dict)


MAX_SCRAPE_BYTES = 4 << 20  # an 8-GPU dcgm-exporter scrape is ~50-300 KiB; a malformed one costs ~13 us/byte
OFFLOAD_BYTES = 1 << 20  # parse bigger scrapes in a thread (~10 ms of CPU and more): the loop stays on time


async def fetch_capped(client: httpx.AsyncClient, url: str, timeout_s: float, max_bytes: int) -> str:
    """The body of `url` as text, refusing (ParseError) a body over `max_bytes` before reading all of it."""
    async with client.stream("GET", url, timeout=timeout_s) as resp:
        resp.raise_for_status()
        declared = resp.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > max_bytes:
            raise ParseError(f"scrape of {int(declared)} bytes declared (at most {max_bytes})")
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.aiter_bytes():  # decoded: a compressed bomb is counted as it inflates
            size += len(chunk)
            if size > max_bytes:
                raise ParseError(f"scrape over {max_bytes} bytes: refused")
            chunks.append(chunk)
        return b"".join(chunks).decode(resp.encoding or "utf-8", errors="replace")


def _offset(url: str, jitter_s: float) -> float:
    return (zlib.crc32(url.encode()) % 1000) / 1000 * jitter_s


class DcgmScraper:
    def __init__(
        self,
        targets: list[Target],
        publisher: Publisher,
        cluster: str,
        *,
        interval_s: float = 1.0,
        timeout_s: float = 0.8,
        jitter_s: float = 0.25,
        backoff_max_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        topic: Topic = DEVICE_SAMPLES,
        max_scrape_bytes: int = MAX_SCRAPE_BYTES,
    ) -> None:
        if not targets:
            raise ConfigError("dcgm producer: no targets")
        self.targets = targets
        self.publisher = publisher
        self.cluster = cluster
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.jitter_s = min(jitter_s, interval_s / 2)
        self.backoff_max_s = backoff_max_s
        self.clock = clock
        self.topic = topic
        self.max_scrape_bytes = max_scrape_bytes
        self.parser = ExpositionParser()
        self.normalizer = Normalizer()
        self.stats = ScrapeStats(targets={t.url: TargetState() for t in targets})
        self._ssl: ssl.SSLContext | None = None

    def build(self, target: Target, text: str, ts_ms: int) -> tuple[str, dict[str, Any]]:
        """Parse, map and build one scrape's record (the CPU part of a scrape): (node, record)."""
        exposition = self.parser.parse(text)
        norm = self.normalizer.normalize(exposition.samples, exporter_version=target.exporter_version)
        node = target.node or norm.hostname or urlsplit(target.url).hostname or target.url
        record = scrape_record(
            cluster=self.cluster, node=node, ts_ms=ts_ms, normalized=norm, exporter_version=target.exporter_version
        )
        return node, record

    def _publish(self, node: str, record: dict[str, Any]) -> dict[str, Any]:
        self.publisher.publish(self.topic, node_key(self.cluster, node), record)
        self.stats.records += 1
        self.stats.devices += len(record["devices"])
        return record

    def handle(self, target: Target, text: str, ts_ms: int) -> dict[str, Any]:
        """Build and publish one scrape's record."""
        return self._publish(*self.build(target, text, ts_ms))

    async def scrape_once(self, client: httpx.AsyncClient, target: Target, ts_ms: int) -> dict[str, Any] | None:
        state = self.stats.targets[target.url]
        try:
            text = await fetch_capped(client, target.url, self.timeout_s, self.max_scrape_bytes)
            if len(text) > OFFLOAD_BYTES:
                record = self._publish(*await asyncio.to_thread(self.build, target, text, ts_ms))
            else:
                record = self.handle(target, text, ts_ms)
        except (httpx.HTTPError, GpuledgerError, ValueError, UnicodeDecodeError, RecursionError) as exc:
            # One target's failure (network, a scrape that does not parse or map) never stops the others.
            state.failures += 1
            state.failed += 1
            self.stats.failed += 1
            delay = min(self.backoff_max_s, self.interval_s * (2 ** min(state.failures, 16)))
            state.retry_at = self.clock() + delay
            if state.failures == 1 or str(exc) != state.last_error:
                log.warning("dcgm %s: %s (retry in %.0fs)", target.url, str(exc) or type(exc).__name__, delay)
            state.last_error = str(exc)
            return None
        if state.failures:
            log.info("dcgm %s: back after %d failures", target.url, state.failures)
        state.failures = 0
        state.ok += 1
        self.stats.ok += 1
        return record

    async def _loop(self, client: httpx.AsyncClient, target: Target, until: float | None) -> None:
        offset = _offset(target.url, self.jitter_s)
        state = self.stats.targets[target.url]
        tick = (int(self.clock() / self.interval_s) + 1) * self.interval_s + offset
        while until is None or tick < until:
            delay = tick - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.clock() >= state.retry_at:
                await self.scrape_once(client, target, int(tick * 1000))
            else:
                state.skipped += 1
            # Next tick; ticks that passed while this one ran are missed, not queued.
            nxt = tick + self.interval_s
            now = self.clock()
            if now > nxt:
                missed = int((now - nxt) / self.interval_s) + 1
                self.stats.missed_ticks += missed
                nxt += missed * self.interval_s
            tick = nxt

    async def run(self, duration_s: float | None = None) -> ScrapeStats:
        until = None if duration_s is None else self.clock() + duration_s
        # One small client per target: httpcore's pool scans every connection on each request, so a
        # single pool over hundreds of targets costs O(targets) per scrape.
        limits = httpx.Limits(max_connections=2, max_keepalive_connections=1)
        if self._ssl is None:
            self._ssl = ssl.create_default_context()  # built once: each context costs ~50 ms of CPU
        clients = [
            httpx.AsyncClient(limits=limits, headers={"Accept": "text/plain"}, verify=self._ssl) for _ in self.targets
        ]
        try:
            await asyncio.gather(*(self._loop(c, t, until) for c, t in zip(clients, self.targets, strict=True)))
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))
        return self.stats
