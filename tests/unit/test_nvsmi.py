"""nvidia-smi --query-gpu CSV loop output to device-samples records (mapping nvsmi-v1)."""

from __future__ import annotations

import pytest

from base.errors import ParseError
from producers.nvsmi import NvsmiReader, read_all
from schemas.codec import AvroCodec

HEADER = (
    "timestamp, index, uuid, name, pci.bus_id, utilization.gpu [%], utilization.memory [%], memory.used [MiB], "
    "memory.free [MiB], memory.total [MiB], power.draw [W], temperature.gpu"
)
LOOP = f"""{HEADER}
2026/03/02 11:30:00.123, 0, GPU-0a1b, NVIDIA A100-SXM4-40GB, 00000000:07:00.0, 45 %, 12 %, 1234 MiB, 39000 MiB, 40960 MiB, 250.12 W, 45
2026/03/02 11:30:00.125, 1, GPU-0a1c, NVIDIA A100-SXM4-40GB, 00000000:0F:00.0, 0 %, 0 %, 0 MiB, 40960 MiB, 40960 MiB, [N/A], 33

2026/03/02 11:30:01.123, 0, GPU-0a1b, NVIDIA A100-SXM4-40GB, 00000000:07:00.0, 47 %, 12 %, 1234 MiB, 39000 MiB, 40960 MiB, 251.00 W, 45
2026/03/02 11:30:01.125, 1, GPU-0a1c, NVIDIA A100-SXM4-40GB, 00000000:0F:00.0, [Not Supported], 0 %, 0 MiB, 40960 MiB, 40960 MiB, 60.10 W, 33
"""  # noqa: E501


def test_loop_output_one_record_per_iteration() -> None:
    recs = list(read_all(LOOP.splitlines(), "c", "n1"))
    assert [r["ts_ms"] for r in recs] == [1772451000123, 1772451001123]
    first, second = recs
    assert first["source"] == "nvidia-smi" and first["mapping_version"] == "nvsmi-v1"
    a, b = first["devices"]
    assert (a["uuid"], a["index"], a["model"], a["pci_bus_id"]) == (
        "GPU-0a1b",
        0,
        "NVIDIA A100-SXM4-40GB",
        "00000000:07:00.0",
    )
    assert (a["gpu_util_pct"], a["mem_copy_util_pct"], a["fb_used_mib"], a["fb_free_mib"]) == (45, 12, 1234, 39000)
    assert a["power_w"] == pytest.approx(250.12) and a["temperature_c"] == 45
    # What nvidia-smi cannot measure, or did not, is null: never 0.
    for k in ("sm_active_ratio", "gr_engine_active_ratio", "tensor_active_ratio", "pcie_tx_bytes_per_s", "xid_last"):
        assert a[k] is None
    assert b["power_w"] is None and second["devices"][1]["gpu_util_pct"] is None
    codec = AvroCodec()
    for r in recs:
        assert codec.decode(codec.encode("telemetry.device-samples", r)).record == r


def test_noheader_nounits_with_given_fields() -> None:
    reader = NvsmiReader(
        cluster="c",
        node="n",
        fields=["index", "uuid", "utilization.gpu", "memory.used"],
        clock_ms=lambda: 1_000_000,
    )
    out = []
    for line in ["0, GPU-1, 80, 1000", "1, GPU-2, 5, 20", "0, GPU-1, 81, 1001"]:
        out.extend(reader.feed(line))
    out.extend(reader.flush())
    assert len(out) == 2 and out[0]["ts_ms"] == 1_000_000
    assert [d["gpu_util_pct"] for d in out[0]["devices"]] == [80, 5]


def test_data_without_header_or_fields_is_an_error() -> None:
    with pytest.raises(ParseError):
        NvsmiReader(cluster="c", node="n").feed("0, GPU-1, 80")
