"""Codec encode/decode throughput for a node scrape of 8 devices, against raw fastavro.

Raw fastavro is `schemaless_writer` into a `BytesIO` / `schemaless_reader` from one, with the
schema parsed once: the floor for Avro in Python. The codec adds the framing (single-object header
or Confluent magic + schema id), the fingerprint or id lookup, the subject check and the
trailing-bytes check. Each variant is timed in several interleaved rounds, in CPU seconds of this
process (the machine is shared), and the best round is reported. Usage:

    .venv/bin/python bench/codec.py [--records 5000] [--rounds 9] [--validate]
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fastavro  # noqa: E402

from schemas.codec import AvroCodec, registry_client  # noqa: E402

SUBJECT = "telemetry.device-samples"
DEVICES = 8


def scrape(i: int) -> dict[str, Any]:
    """One node scrape with every canonical metric present, as the DCGM producer writes it."""
    return {
        "cluster": "bench",
        "node": f"gpu-node-{i % 500:04d}",
        "ts_ms": 1_700_000_000_000 + i * 1000,
        "source": "dcgm-exporter",
        "exporter_version": "4.4.2-4.7.1",
        "mapping_version": "m1",
        "devices": [
            {
                "uuid": f"GPU-{d:08x}-1111-2222-3333-444455556666",
                "index": d,
                "mig_instance_id": None,
                "mig_profile": None,
                "model": "NVIDIA H100 80GB HBM3",
                "pci_bus_id": f"00000000:{d + 16:02X}:00.0",
                "sm_active_ratio": 0.61 + d / 100,
                "sm_occupancy_ratio": 0.33,
                "gr_engine_active_ratio": 0.72,
                "tensor_active_ratio": 0.21,
                "dram_active_ratio": 0.44,
                "gpu_util_pct": 97.0,
                "mem_copy_util_pct": 12.0,
                "fb_used_mib": 61_000.0 + d,
                "fb_free_mib": 20_000.0,
                "power_w": 512.5,
                "pcie_tx_bytes_per_s": 1.2e9,
                "pcie_rx_bytes_per_s": 3.4e9,
                "temperature_c": 61.0,
                "xid_last": 0,
                "pod": None,
                "namespace": None,
                "container": None,
                "hpc_job": "4242",
            }
            for d in range(DEVICES)
        ],
    }


def best_rate(fn: Callable[[], None], n: int, rounds: list[float]) -> None:
    """Records per CPU second of this process (not wall time: the machine is shared)."""
    started = time.process_time()
    fn()
    rounds.append(n / (time.process_time() - started))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--validate", action="store_true", help="also time model validation of decoded records")
    args = parser.parse_args()

    records = [scrape(i) for i in range(64)]
    n = args.records
    single = AvroCodec()
    confluent = AvroCodec(registry_client("mock://bench"))
    parsed = single.parsed_schema(SUBJECT)
    raw_bodies = []
    for r in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, r)
        raw_bodies.append(buf.getvalue())
    single_data = [single.encode(SUBJECT, r) for r in records]
    confluent_data = [confluent.encode(SUBJECT, r) for r in records]
    assert single.decode(single_data[0]).record == records[0] == confluent.decode(confluent_data[0]).record

    def raw_encode() -> None:
        writer = fastavro.schemaless_writer
        for i in range(n):
            buf = io.BytesIO()
            writer(buf, parsed, records[i & 63])
            buf.getvalue()

    def raw_decode() -> None:
        reader = fastavro.schemaless_reader
        for i in range(n):
            reader(io.BytesIO(raw_bodies[i & 63]), parsed, None)

    def codec_encode(codec: AvroCodec) -> Callable[[], None]:
        def run() -> None:
            encode = codec.encode
            for i in range(n):
                encode(SUBJECT, records[i & 63])

        return run

    def codec_decode(codec: AvroCodec, data: list[bytes]) -> Callable[[], None]:
        def run() -> None:
            decode = codec.decode
            for i in range(n):
                decode(data[i & 63], SUBJECT)

        return run

    variants: dict[str, Callable[[], None]] = {
        "encode raw fastavro": raw_encode,
        "encode codec single-object": codec_encode(single),
        "encode codec confluent": codec_encode(confluent),
        "decode raw fastavro": raw_decode,
        "decode codec single-object": codec_decode(single, single_data),
        "decode codec confluent": codec_decode(confluent, confluent_data),
    }
    if args.validate:
        from schemas.models import validate

        def decode_validate() -> None:
            decode = single.decode
            for i in range(n):
                validate(SUBJECT, decode(single_data[i & 63], SUBJECT).record)

        variants["decode+validate codec single-object"] = decode_validate
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            best_rate(fn, n, rates[name])

    print(f"node scrape of {DEVICES} devices, {len(single_data[0])} bytes single-object; best of {args.rounds} rounds,"
          " per CPU second")
    print(f"{'variant':38} {'records/s':>11} {'samples/s':>11} {'vs raw':>8}")
    for name, values in rates.items():
        best = max(values)
        raw = max(rates["encode raw fastavro" if name.startswith("encode") else "decode raw fastavro"])
        overhead = (raw / best - 1) * 100
        print(f"{name:38} {best:11,.0f} {best * DEVICES:11,.0f} {overhead:+7.1f}%")


if __name__ == "__main__":
    main()
