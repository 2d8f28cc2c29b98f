"""Charts drawn on the server as SVG text: pure, no JavaScript, nothing fetched by the browser.

Colours are CSS classes (`c-active`, `c-starved`, `c-idle`, `c-dark`, styled by static/style.css), so the
page's Content-Security-Policy needs no inline style. Every bar or strip carries a `<title>` with its
figures (the browser's tooltip) and the chart a `<desc>` for screen readers.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from html import escape

from web.model import CLASSES, Day, gpu_h

STACK = ("active", "starved", "idle", "dark")  # bottom to top: consumed (active + starved) first


def _nice_max(value: float) -> float:
    """A round axis maximum at or above `value` (1, 2 or 5 times a power of ten)."""
    if value <= 0:
        return 1.0
    magnitude = 10 ** (len(str(int(value))) - 1) if value >= 1 else 1
    for step in (1, 2, 5, 10):
        if value <= step * magnitude:
            return float(step * magnitude)
    return float(10 * magnitude)


def daily_chart(days: Sequence[Day], *, width: int = 960, height: int = 260) -> str:
    """Stacked bars per day: allocated GPU-hours split by class; the top of the green and amber parts is
    what was consumed."""
    left, right, top, bottom = 56, 12, 16, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max((d.allocated_s for d in days), default=0) / 3600
    axis = _nice_max(peak)
    bar_w = plot_w / max(len(days), 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-labelledby="daily-title daily-desc">',
        '<title id="daily-title">Allocated GPU-hours per day by class</title>',
        f'<desc id="daily-desc">{escape(_describe(days))}</desc>',
    ]
    for i in range(5):
        value = axis * i / 4
        y = top + plot_h - plot_h * i / 4
        parts.append(f'<line class="grid" x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(f'<text class="axis" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{value:g}</text>')
    mid = f"{top + plot_h / 2:.0f}"
    parts.append(f'<text class="axis" x="12" y="{mid}" transform="rotate(-90 12 {mid})" '
                 'text-anchor="middle">GPU-h</text>')
    for i, day in enumerate(days):
        x = left + i * bar_w
        y = top + plot_h
        for cls in STACK:
            seconds = getattr(day, f"{cls}_s")
            if seconds <= 0:
                continue
            h = plot_h * (seconds / 3600) / axis
            y -= h
            tip = f"{day.day.isoformat()} {cls}: {gpu_h(seconds)} GPU-h"
            parts.append(f'<rect class="c-{cls}" x="{x + 1:.1f}" y="{y:.2f}" width="{max(bar_w - 2, 1):.1f}" '
                         f'height="{h:.2f}"><title>{tip}</title></rect>')  # fmt: skip
        if day.day.day == 1 or (i % max(1, len(days) // 8) == 0):
            parts.append(f'<text class="axis" x="{x + bar_w / 2:.1f}" y="{top + plot_h + 16}" '
                         f'text-anchor="middle">{day.day:%d %b}</text>')  # fmt: skip
    parts.append(_legend(left, height - 8))
    parts.append("</svg>")
    return "".join(parts)


def _legend(x: int, y: int) -> str:
    out = []
    for i, cls in enumerate(STACK):
        lx = x + i * 110
        out.append(f'<rect class="c-{cls}" x="{lx}" y="{y - 10}" width="10" height="10"/>'
                   f'<text class="axis" x="{lx + 14}" y="{y}">{cls}</text>')  # fmt: skip
    return "".join(out)


def _describe(days: Sequence[Day]) -> str:
    allocated = sum(d.allocated_s for d in days)
    consumed = sum(d.consumed_s for d in days)
    return (f"{len(days)} days; allocated {gpu_h(allocated)} GPU-h, consumed {gpu_h(consumed)} GPU-h "
            f"(active and starved), the rest idle or dark.")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Strip:
    """One device's minutes over a window: (minute_start_ms, class) per stored minute."""

    label: str
    minutes: Sequence[tuple[int, str]]


def device_timeline(strips: Sequence[Strip], start_ms: int, end_ms: int, *, width: int = 960) -> str:
    """One row per device, one run of colour per stretch of minutes in the same class; minutes with no row
    (not held) are left blank."""
    left, row_h, top = 230, 18, 20
    span = max(end_ms - start_ms, 60_000)
    plot_w = width - left - 10
    height = top + row_h * len(strips) + 28
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" role="img" '
        'aria-labelledby="tl-title"><title id="tl-title">Each device minute by minute, coloured by class</title>',
    ]
    for hour in range(0, span // 3_600_000 + 1, max(1, span // 3_600_000 // 12)):
        x = left + plot_w * hour * 3_600_000 / span
        label = dt.datetime.fromtimestamp((start_ms + hour * 3_600_000) / 1000, dt.UTC).strftime("%H:%M")
        anchor = "end" if x > left + plot_w - 20 else "middle"
        parts.append(f'<text class="axis" x="{x:.1f}" y="12" text-anchor="{anchor}">{label}</text>')
    for row, strip in enumerate(strips):
        y = top + row * row_h
        parts.append(f'<text class="axis" x="{left - 6}" y="{y + 12}" text-anchor="end">{escape(strip.label)}</text>')
        for first, last, cls in _runs(strip.minutes):
            x = left + plot_w * (first - start_ms) / span
            w = max(plot_w * (last + 60_000 - first) / span, 0.5)
            base = cls.split(" ", 1)[0]
            css = f"c-{base}" if base in CLASSES else "c-none"
            when = f"{_hm(first)} to {_hm(last + 60_000)}"
            parts.append(f'<rect class="{css}" x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h - 4}">'
                         f'<title>{escape(strip.label)} {when}: {escape(cls)}</title></rect>')  # fmt: skip
    parts.append(_legend(left, height - 6))
    parts.append("</svg>")
    return "".join(parts)


def _runs(minutes: Sequence[tuple[int, str]]) -> list[tuple[int, int, str]]:
    """Consecutive minutes of one class as (first minute, last minute, class)."""
    runs: list[tuple[int, int, str]] = []
    for minute, cls in sorted(minutes):
        if runs and runs[-1][2] == cls and runs[-1][1] + 60_000 == minute:
            runs[-1] = (runs[-1][0], minute, cls)
        else:
            runs.append((minute, minute, cls))
    return runs


def _hm(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%H:%M")


def bar(part: Decimal | float | None, whole: Decimal | float | None) -> int:
    """A percentage for a CSS width: 0..100."""
    if part is None or whole is None or float(whole) <= 0:
        return 0
    return max(0, min(100, round(100 * float(part) / float(whole))))
