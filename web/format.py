"""How figures read on the page (Jinja2 filters); CSV downloads keep the plain values."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from typing import Any


def cell(value: Any, kind: str = "text") -> str:
    if value is None or value == "":
        return "-" if kind != "text" else ""
    if kind == "money":
        amount = Decimal(value).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
        return f"-${-amount:,.2f}" if amount < 0 else f"${amount:,.2f}"
    if kind == "gpu_h":  # half-up, as the report rounds (format() alone would round half-even)
        hours = Decimal(value)
        places = Decimal("0.01") if abs(hours) >= 100 else Decimal("0.0001")
        return f"{hours.quantize(places, rounding=ROUND_HALF_UP):,}"
    if kind == "pct":
        return f"{float(value):.1f}%"
    if kind == "ratio":
        return f"{float(value):.3f}"
    if kind == "minutes":
        return f"{Decimal(value):,.1f}"
    if kind == "int":
        return f"{int(value):,}"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def numeric(kind: str) -> bool:
    return kind in ("money", "gpu_h", "pct", "ratio", "int", "minutes")


def minute(ms: Any) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(int(ms) / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


FILTERS = {"cell": cell, "numeric": numeric, "minute": minute}
