"""What the typed records (schemas/records.py) cost per record, next to the codec's decode.

For a node scrape of 8 devices (the record bench/codec.py times), a job event and a device-minute:
`from_avro` (decoded dict -> typed record), `to_avro` (typed -> the dict the codec encodes), and
the codec's single-object decode of the same record for scale. Microseconds per record per CPU
second of this process (the machine is shared), best of several interleaved rounds. Usage:

    .venv/bin/python bench/records.py [--records 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from codec import scrape  # noqa: E402

from schemas import load_schema  # noqa: E402
from schemas.codec import AvroCodec  # noqa: E402
from schemas.evolution import sample_records  # noqa: E402
from schemas.records import RECORDS  # noqa: E402


def samples() -> dict[str, dict[str, Any]]:
    """One representative record per timed subject (the fullest sample for the small ones)."""
    out: dict[str, dict[str, Any]] = {"telemetry.device-samples": scrape(0)}
    for subject in ("sched.job-events", "usage.device-minutes"):
        out[subject] = max(sample_records(load_schema(subject)), key=lambda r: sum(v is not None for v in r.values()))
    return out


def best_us(fn: Callable[[], None], n: int, rounds: list[float]) -> None:
    started = time.process_time()
    fn()
    rounds.append((time.process_time() - started) / n * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    n = args.records
    codec = AvroCodec()
    print(
        f"{'subject':<26} {'decode (codec)':>15} {'from_avro':>10} {'to_avro':>8}  µs per record, best of {args.rounds}"
    )
    for subject, record in samples().items():
        cls = RECORDS[subject]
        typed = cls.from_avro(record)
        data = codec.encode(subject, typed.to_avro())
        assert data == codec.encode(subject, record)

        def decode(data: bytes = data) -> None:
            for _ in range(n):
                codec.decode(data)

        def from_avro(cls: Any = cls, record: dict[str, Any] = record) -> None:
            for _ in range(n):
                cls.from_avro(record)

        def to_avro(typed: Any = typed) -> None:
            for _ in range(n):
                typed.to_avro()

        timings: dict[str, list[float]] = {"decode": [], "from": [], "to": []}
        for _ in range(args.rounds):
            best_us(decode, n, timings["decode"])
            best_us(from_avro, n, timings["from"])
            best_us(to_avro, n, timings["to"])
        d, f, t = (min(timings[k]) for k in ("decode", "from", "to"))
        print(f"{subject:<26} {d:>15.2f} {f:>10.2f} {t:>8.2f}")


if __name__ == "__main__":
    main()
