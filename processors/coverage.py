"""Coverage: inventory vs telemetry arrival. Missing data is not zero: a device the inventory expects
that stops reporting is a coverage gap (never idle), a reporting device the inventory does not know is
flagged, and every node-minute gets a coverage figure (expected vs reporting device-seconds).

Pure: arrivals and the clock (`now_ms`, event time or wall clock, chosen by the caller) come in as data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from processors.windows import DeviceWindow

SeenKey = tuple[str, str, int | None]  # (node, uuid, mig_instance_id)


@dataclass(frozen=True, slots=True)
class Expected:
    uuid: str | None
    index: int
    mig_instance_id: int | None

    def matches(self, uuid: str, index: int | None, mig: int | None) -> bool:
        if self.mig_instance_id != mig:
            return False
        if self.uuid is not None:
            return self.uuid == uuid
        return index == self.index

    @property
    def label(self) -> str:
        base = self.uuid or f"index:{self.index}"
        return base if self.mig_instance_id is None else f"{base}/mig:{self.mig_instance_id}"


def _alert_id(*parts: object) -> str:
    return hashlib.sha1("/".join(map(str, parts)).encode(), usedforsecurity=False).hexdigest()[:24]


def coverage_alert(
    kind: str, cluster: str, node: str, ts_ms: int, devices: list[str], message: str, cause: object
) -> dict[str, Any]:
    return {
        "alert_id": _alert_id(kind, cluster, node, ",".join(devices), cause),
        "kind": kind,
        "ts_ms": ts_ms,
        "cluster": cluster,
        "job_id": None,
        "node": node,
        "device_uuids": devices,
        "user": None,
        "team": None,
        "project": None,
        "idle_minutes": None,
        "cost_so_far": None,
        "action": None,
        "action_at_ms": None,
        "dry_run": True,
        "message": message,
        "appeal_route": None,
        "emitted_ts_ms": None,
    }


class CoverageTracker:
    """Last-seen per device of the nodes of one partition, against their inventory."""

    def __init__(self, cluster_of: Mapping[str, str] | None = None, timeout_ms: int = 120_000) -> None:
        self.timeout_ms = timeout_ms
        self.expected: dict[str, list[Expected]] = {}  # node -> devices
        self.cluster: dict[str, str] = dict(cluster_of or {})
        self.tracking_since: dict[str, int] = {}  # node -> when its inventory arrived (event time)
        self.last_seen: dict[SeenKey, int] = {}  # hot path: written once per device sample
        self.index_of: dict[SeenKey, int | None] = {}
        self.gaps: dict[tuple[str, Expected], int] = {}  # open gap -> last seen before it
        self.flagged_unknown: set[SeenKey] = set()
        self.unchecked: list[SeenKey] = []  # devices not yet compared with their node's inventory
        # node -> no device of it can time out before this: last-seen times only grow, so a node is
        # rescanned about once per timeout instead of every tick (nodes with an open gap: every tick)
        self._quiet_until: dict[str, int] = {}

    # -- inputs
    def set_inventory(self, cluster: str, node: str, ts_ms: int, devices: list[Mapping[str, Any]] | None) -> None:
        self._quiet_until.pop(node, None)
        if devices is None:  # node retired
            self.expected.pop(node, None)
            self.tracking_since.pop(node, None)
            for key in [k for k in self.gaps if k[0] == node]:
                del self.gaps[key]
            return
        self.cluster[node] = cluster
        self.expected[node] = [
            Expected(d.get("uuid"), int(d["index"]), d.get("mig_instance_id"))
            for d in sorted(devices, key=lambda d: (d["index"], d.get("mig_instance_id") or -1))
        ]
        self.tracking_since.setdefault(node, ts_ms)
        self.unchecked.extend(k for k in self.index_of if k[0] == node and k not in self.flagged_unknown)

    def seen(self, cluster: str, node: str, uuid: str, index: int | None, mig: int | None, ts_ms: int) -> None:
        key = (node, uuid, mig)
        if self.last_seen.get(key, -1) < ts_ms:
            self.last_seen[key] = ts_ms
        if key not in self.index_of:
            self.index_of[key] = index
            self.unchecked.append(key)
            self.cluster.setdefault(node, cluster)

    # -- queries
    def _last_seen(self, node: str, exp: Expected) -> int | None:
        if exp.uuid is not None:
            return self.last_seen.get((node, exp.uuid, exp.mig_instance_id))
        best: int | None = None
        for key, idx in self.index_of.items():
            if key[0] == node and exp.matches(key[1], idx, key[2]):
                ts = self.last_seen[key]
                best = ts if best is None else max(best, ts)
        return best

    def _known(self, node: str, uuid: str, index: int | None, mig: int | None) -> bool:
        return any(e.matches(uuid, index, mig) for e in self.expected.get(node, ()))

    def on_tick(self, now_ms: int) -> list[dict[str, Any]]:
        """Alerts due at `now_ms`: gaps past the timeout, recoveries, devices not in the inventory."""
        alerts: list[dict[str, Any]] = []
        for node in sorted(self.expected):
            if now_ms < self._quiet_until.get(node, now_ms):
                continue
            cluster = self.cluster.get(node, "")
            quiet_until: int | None = None
            for exp in self.expected[node]:
                last = self._last_seen(node, exp)
                gap_key = (node, exp)
                if gap_key in self.gaps:
                    quiet_until = now_ms  # watch for its recovery every tick
                    if last is not None and last > self.gaps[gap_key]:
                        since = self.gaps.pop(gap_key)
                        alerts.append(
                            coverage_alert(
                                "COVERAGE_RECOVERED",
                                cluster,
                                node,
                                last,
                                [exp.label],
                                f"{node} {exp.label} reports again (silent since {since} ms)",
                                since,
                            )
                        )
                    continue
                ref = last if last is not None else self.tracking_since.get(node, now_ms)
                due = ref + self.timeout_ms
                quiet_until = due if quiet_until is None else min(quiet_until, due)
                if now_ms - ref >= self.timeout_ms:
                    self.gaps[gap_key] = ref
                    alerts.append(
                        coverage_alert(
                            "COVERAGE_GAP",
                            cluster,
                            node,
                            ref + self.timeout_ms,
                            [exp.label],
                            f"{node} {exp.label}: no telemetry for {(now_ms - ref) // 1000} s "
                            f"(timeout {self.timeout_ms // 1000} s); its allocated seconds count as dark",
                            ref,
                        )
                    )
            self._quiet_until[node] = now_ms if quiet_until is None else quiet_until
        pending, self.unchecked = self.unchecked, []
        for key in sorted(set(pending), key=lambda k: (k[0], k[1], -1 if k[2] is None else k[2])):
            node, uuid, mig = key
            if node not in self.expected:
                self.unchecked.append(key)  # judged once the node's inventory is known
                continue
            if key not in self.flagged_unknown and not self._known(node, uuid, self.index_of.get(key), mig):
                self.flagged_unknown.add(key)
                label = uuid if mig is None else f"{uuid}/mig:{mig}"
                alerts.append(
                    coverage_alert(
                        "UNKNOWN_DEVICE",
                        self.cluster.get(node, ""),
                        node,
                        self.last_seen[key],
                        [label],
                        f"{node} reports {label}, which its inventory does not list",
                        "unknown",
                    )
                )
        return alerts

    def minute(
        self, cluster: str, node: str, minute_ms: int, windows: Mapping[tuple[str, int | None], DeviceWindow]
    ) -> dict[str, Any]:
        """CoverageMinute of a node: expected vs reporting device-seconds in the minute."""
        expected = self.expected.get(node, [])
        reporting = 0
        reporting_s = 0
        matched: set[tuple[str, int | None]] = set()
        for exp in expected:
            best = 0
            if exp.uuid is not None:  # matched by its UUID: one window at most
                key = (exp.uuid, exp.mig_instance_id)
                win = windows.get(key)
                if win is not None:
                    matched.add(key)
                    best = win.count()
            else:
                for (uuid, mig), win in windows.items():
                    if exp.matches(uuid, win.index, mig):
                        matched.add((uuid, mig))
                        best = max(best, win.count())
            if best:
                reporting += 1
                reporting_s += best
        return {
            "cluster": cluster,
            "node": node,
            "minute_start_ms": minute_ms,
            "expected_devices": len(expected),
            "reporting_devices": reporting,
            "expected_device_s": 60 * len(expected),
            "reporting_device_s": reporting_s,
            "unexpected_devices": len([k for k in windows if k not in matched]),
        }

    def tracked_devices(self) -> int:
        return len(self.last_seen)
