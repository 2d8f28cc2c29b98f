"""dcgm-exporter scrapes (real ones, and ones built from every counter catalogue) to canonical devices."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from base.errors import ParseError
from producers.dcgm import ExpositionParser, Normalizer, RawSample, normalize_text, parse_exposition, scrape_record
from producers.mapping import load_mappings, parse_mapping_csv, parse_version
from producers.records import device_sample_fields
from producers.simulator.telemetry import render_exposition
from schemas.codec import AvroCodec
from schemas.generations import generation_of

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm"
EXPOSITIONS = FIXTURES / "exposition"
COUNTERS = FIXTURES / "counters"
CATALOGUE_VERSIONS = sorted(p.name for p in COUNTERS.iterdir() if p.is_dir())

H100_UUIDS = [
    "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005",
    "GPU-bc5610b9-79c8-fedd-8899-07539c7f868a",
    "GPU-fbc2c554-4d37-8938-0032-f923bad0f716",
    "GPU-a65a773d-52bb-bcc1-a8ee-f78c3faa2e2d",
    "GPU-82e45d1b-1618-559f-144c-eab51545030b",
    "GPU-39e28159-8c62-ee71-64db-b748edd61e15",
    "GPU-e64d69ca-b4b3-59b2-e78c-94f26c4db365",
    "GPU-04d228d3-3b5a-3534-f5cf-969706647d56",
]


def _exposition(name: str) -> str:
    (path,) = EXPOSITIONS.glob(f"{name}*")
    return path.read_text()


def _check_fast_parser_agrees(text: str) -> None:
    ref = parse_exposition(text)
    fast = ExpositionParser().parse(text)
    assert [(s.name, dict(s.labels), s.value) for s in fast.samples] == [
        (s.name, dict(s.labels), s.value) for s in ref.samples
    ]


def test_t4_bare_metal() -> None:
    text = _exposition("cncf-aiconf_ericsson-ccd_T4")
    _check_fast_parser_agrees(text)
    n = normalize_text(text)
    assert n.hostname == "cp-bm14r7" and n.driver_version == "590.48.01"
    assert n.mapping_version == "dcgm-v3" and not n.warnings
    (d,) = n.devices
    assert d["uuid"] == "GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a" and d["index"] == 0
    assert d["model"] == "Tesla T4" and generation_of(d["model"]) == "turing"
    assert d["pci_bus_id"] == "00000000:37:00.0" and d["mig_instance_id"] is None
    assert (d["gpu_util_pct"], d["mem_copy_util_pct"], d["fb_used_mib"], d["fb_free_mib"]) == (91, 73, 5120, 9791)
    assert d["power_w"] == pytest.approx(68.244) and d["temperature_c"] == 74 and d["xid_last"] is None
    assert d["gr_engine_active_ratio"] == pytest.approx(0.156205)
    assert d["tensor_active_ratio"] == pytest.approx(0.005822) and d["dram_active_ratio"] == pytest.approx(0.092781)
    assert d["pcie_tx_bytes_per_s"] == 4791810 and d["pcie_rx_bytes_per_s"] == 6935930
    assert d["sm_active_ratio"] is None and d["pod"] is None


def test_l4_two_scrapes_and_trailing_test_output() -> None:
    text = _exposition("cncf-aiconf_kops_L4")
    n = normalize_text(text)
    assert n.hostname == "i-030791dc5a37cd257"
    (d,) = n.devices
    assert d["uuid"] == "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c" and d["model"] == "NVIDIA L4"
    assert generation_of(d["model"]) == "ada"
    assert d["gpu_util_pct"] == 0 and d["fb_free_mib"] == 22563 and d["power_w"] == pytest.approx(16.365)
    assert n.skipped_lines == 4 and any("not Prometheus text" in w for w in n.warnings)
    _check_fast_parser_agrees(text)


def test_h100_eight_gpus_with_pod_labels_in_a_document() -> None:
    text = _exposition("nvidia-aicr_h100")
    n = normalize_text(text)
    assert n.hostname == "gpu-node-1"
    assert [d["uuid"] for d in n.devices] == H100_UUIDS
    assert [d["index"] for d in n.devices] == list(range(8))
    assert {generation_of(d["model"]) for d in n.devices} == {"hopper"}
    gpu0 = n.devices[0]
    assert (gpu0["pod"], gpu0["namespace"], gpu0["container"]) == (
        "vllm-agg-0-vllmdecodeworker-s65j5",
        "dynamo-workload",
        "main",
    )
    assert all(d["pod"] is None for d in n.devices[1:])
    assert gpu0["temperature_c"] == 30 and gpu0["power_w"] == pytest.approx(113.611)
    assert [d["gpu_util_pct"] for d in n.devices] == [0] * 8
    assert n.skipped_lines > 100  # the Markdown/JSON lines around the scrape


def test_a100_mig_instances_are_devices() -> None:
    text = _exposition("nvidia-cloud-native-docs_A100-MIG")
    _check_fast_parser_agrees(text)
    n = normalize_text(text)
    assert n.hostname == "ub20-a100-k8s"
    whole, mig = n.devices
    assert whole["uuid"] == mig["uuid"] == "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"
    assert (whole["mig_instance_id"], whole["mig_profile"]) == (None, None)
    assert (mig["mig_instance_id"], mig["mig_profile"]) == (13, "1g.5gb")
    assert whole["gr_engine_active_ratio"] == pytest.approx(0.99563)
    assert mig["gr_engine_active_ratio"] == pytest.approx(0.995687) and mig["fb_used_mib"] is None
    assert whole["fb_used_mib"] == 4845 and whole["pcie_rx_bytes_per_s"] == 97863601


@pytest.mark.parametrize("name", sorted(p.name for p in EXPOSITIONS.iterdir()))
def test_every_exposition_encodes(name: str) -> None:
    n = normalize_text((EXPOSITIONS / name).read_text())
    rec = scrape_record(cluster="c", node=n.hostname or "x", ts_ms=1, normalized=n)
    codec = AvroCodec()
    assert codec.decode(codec.encode("telemetry.device-samples", rec)).record == rec


def _catalogue_fields(version: str) -> list[tuple[str, str]]:
    """(field, help) of every field a catalogue version lists, enabled or commented out."""
    out: dict[str, str] = {}
    for csv_file in sorted((COUNTERS / version).glob("*.csv")):
        for line in csv_file.read_text().splitlines():
            body = line.lstrip("#").strip()
            if not body.lower().startswith("dcgm_"):
                continue
            parts = [p.strip() for p in body.split(",", 2)]
            if len(parts) == 3 and parts[1] != "label":
                out.setdefault(parts[0], parts[2])
    return list(out.items())


def _value_for(field: str, help_text: str) -> float:
    """A plausible value in the catalogue's own unit."""
    if field.upper().endswith(("_UTIL", "_UTILIZATION")):
        return 40.0
    if field.upper() == "DCGM_FI_PROF_SM_ACTIVE" and "(in %)" in help_text:
        return 0.5  # the exporter prints ratios even where the help text says percent
    if "_PROF_" in field.upper() and "BYTES" not in field.upper():
        return 0.5
    if field.upper().endswith("_THROUGHPUT"):
        return 100.0  # KB/s
    if field.upper().endswith("PCIE_TX_BYTES") or field.upper().endswith("PCIE_RX_BYTES"):
        return 102400.0
    if field.upper().endswith("FB_USED"):
        return 2048.0
    return 7.0


@pytest.mark.parametrize("version", CATALOGUE_VERSIONS)
def test_scrape_built_from_each_catalogue(version: str) -> None:
    catalogues = [version]
    if (COUNTERS / version / "1.x-compatibility-metrics.csv").exists():
        catalogues.append("1.x")
    for which in catalogues:
        fields = [(f, h) for f, h in _catalogue_fields(version) if (f.startswith("dcgm_") == (which == "1.x"))]
        assert fields
        host_label = "hostname" if parse_version(version) >= (4, 7, 1) else "Hostname"
        uuids = ["GPU-00000000-0000-0000-0000-00000000000a", "GPU-00000000-0000-0000-0000-00000000000b"]
        label_sets = [
            {"gpu": "0", "UUID": uuids[0], "device": "nvidia0", "modelName": "NVIDIA A100-SXM4-40GB", host_label: "n1"},
            {"gpu": "1", "UUID": uuids[1], "device": "nvidia1", "modelName": "NVIDIA A100-SXM4-40GB", host_label: "n1"},
            {
                "gpu": "1",
                "UUID": uuids[1],
                "device": "nvidia1",
                "modelName": "NVIDIA A100-SXM4-40GB",
                host_label: "n1",
                "GPU_I_PROFILE": "3g.20gb",
                "GPU_I_ID": "2",
            },
        ]
        samples = [RawSample(f, labels, _value_for(f, h)) for f, h in fields for labels in label_sets]
        text = render_exposition(samples)
        _check_fast_parser_agrees(text)
        exporter = "1.1.0" if which == "1.x" else version
        n = normalize_text(text, exporter_version=exporter, normalizer=Normalizer())
        assert not n.unknown_metrics, n.unknown_metrics
        assert n.hostname == "n1"
        assert [(d["uuid"], d["mig_instance_id"]) for d in n.devices] == [
            (uuids[0], None),
            (uuids[1], None),
            (uuids[1], 2),
        ]
        assert n.devices[2]["mig_profile"] == "3g.20gb"
        names = {f.upper() for f, _ in fields}
        d = n.devices[0]
        util = "DCGM_FI_DEV_GPU_UTIL" in names or "DCGM_GPU_UTILIZATION" in names
        assert d["gpu_util_pct"] == (40.0 if util else None)
        assert d["fb_used_mib"] == 2048.0
        pcie = {"DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_TX_BYTES".lower()}
        if names & {p.upper() for p in pcie}:
            assert d["pcie_tx_bytes_per_s"] == 102400.0  # 100 KB/s and 102400 B/s are the same rate
        if "DCGM_FI_PROF_SM_ACTIVE" in names:
            assert d["sm_active_ratio"] == 0.5
        if "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in names:
            assert d["gr_engine_active_ratio"] == 0.5


@pytest.mark.parametrize("version", CATALOGUE_VERSIONS)
def test_mapping_knows_every_catalogue_field(version: str) -> None:
    mapping = load_mappings().for_exporter(version)
    schema_fields = set(device_sample_fields())
    for field, _ in _catalogue_fields(version):
        owner = load_mappings().get("dcgm-v1") if field.startswith("dcgm_") else mapping
        rule = owner.rule(field)
        assert rule is not None, f"{field} of {version} missing from {mapping.version}"
        assert rule.canonical is None or rule.canonical in schema_fields


def test_mapping_versions_follow_the_exporter_changes() -> None:
    maps = load_mappings()
    assert [maps.for_exporter(v).version for v in ("2.2.9-2.4.1", "3.3.5-3.4.0", "3.3.7-3.5.0", "4.4.2-4.7.1")] == [
        "dcgm-v2",
        "dcgm-v2",
        "dcgm-v3",
        "dcgm-v4",
    ]
    v2, v3, v4 = maps.get("dcgm-v2"), maps.get("dcgm-v3"), maps.get("dcgm-v4")
    assert v2.rules["DCGM_FI_DEV_PCIE_TX_THROUGHPUT"].scale == 1024  # KB -> bytes
    assert "DCGM_FI_DEV_PCIE_TX_THROUGHPUT" not in v3.rules
    assert (v3.rules["DCGM_FI_DEV_POWER_VIOLATION"].unit, v4.rules["DCGM_FI_DEV_POWER_VIOLATION"].unit) == ("us", "ns")
    assert (
        v2.rules["DCGM_FI_PROF_SM_ACTIVE"].unit == "auto_ratio" and v4.rules["DCGM_FI_PROF_SM_ACTIVE"].unit == "ratio"
    )


def test_percent_profiling_values_become_ratios() -> None:
    labels = {"UUID": "GPU-1", "gpu": "0"}
    n = Normalizer().normalize([RawSample("DCGM_FI_PROF_SM_ACTIVE", labels, 62.0)], exporter_version="2.4.6-2.6.10")
    assert n.devices[0]["sm_active_ratio"] == pytest.approx(0.62) and n.warnings


def test_detects_mapping_without_a_version() -> None:
    norm = Normalizer()
    lab = {"UUID": "GPU-1", "gpu": "0", "hostname": "h"}
    assert norm.normalize([RawSample("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", lab, 1.0)]).mapping_version == "dcgm-v2"
    assert norm.normalize([RawSample("dcgm_gpu_utilization", lab, 1.0)]).mapping_version == "dcgm-v1"
    assert norm.normalize([RawSample("DCGM_FI_DEV_GPU_UTIL", lab, 1.0)]).mapping_version == "dcgm-v4"
    lab2 = {"UUID": "GPU-1", "gpu": "0", "Hostname": "h"}
    assert norm.normalize([RawSample("DCGM_FI_DEV_GPU_UTIL", lab2, 1.0)]).mapping_version == "dcgm-v3"


def test_unknown_metric_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    norm = Normalizer()
    lab = {"UUID": "GPU-1", "gpu": "0"}
    samples = [RawSample("DCGM_FI_DEV_NEW_THING", lab, 1.0), RawSample("DCGM_FI_DEV_FB_USED", lab, 5.0)]
    with caplog.at_level(logging.WARNING, logger="producers.dcgm"):
        for _ in range(3):
            n = norm.normalize(samples, exporter_version="4.4.2-4.7.1")
            assert n.devices[0]["fb_used_mib"] == 5.0
            assert n.unknown_metrics == {"DCGM_FI_DEV_NEW_THING": 1}
    assert norm.unknown_counts["DCGM_FI_DEV_NEW_THING"] == 3
    assert len([r for r in caplog.records if "DCGM_FI_DEV_NEW_THING" in r.getMessage()]) == 1


def test_label_variants_and_vgpu_models() -> None:
    lab = {
        "uuid": "GPU-9",
        "gpu": "3",
        "hostname": "h9",
        "modelName": "GRID A100-40C",
        "hpc_job": "4242",
        "exported_namespace": "team-a",
        "exported_pod": "p-0",
    }
    (d,) = Normalizer().normalize([RawSample("DCGM_FI_DEV_GPU_UTIL", lab, 12.0)], exporter_version="3.5.0").devices
    assert (d["uuid"], d["index"], d["hpc_job"], d["namespace"], d["pod"]) == ("GPU-9", 3, "4242", "team-a", "p-0")
    assert generation_of(d["model"]) == "ampere"
    n = Normalizer().normalize([RawSample("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}, 1.0)], exporter_version="3.5.0")
    assert not n.devices and any("without a UUID" in w for w in n.warnings)


def test_mapping_parser_reports_the_bad_line() -> None:
    text = (
        "# comment\nfield,canonical,unit,scale,priority,type,help\n"
        "A,gpu_util_pct,percent,1,1,gauge,x\nB,-,x,notanumber,1,g,h\n"
    )
    with pytest.raises(ParseError, match=r":4:"):
        parse_mapping_csv(text, "t", origin="m.csv")


def test_nothing_to_parse_is_an_error() -> None:
    with pytest.raises(ParseError):
        normalize_text("hello world\n")


def test_exporter_versions_and_tags() -> None:
    assert parse_version("4.4.2-4.7.1") == (4, 7, 1)
    assert parse_version("3.3.5-3.4.0-ubuntu22.04") == (3, 4, 0)
    assert parse_version("pre-2.1-c9a29aa") == (2, 1)
    assert parse_version("v3.5.0") == (3, 5, 0)
    with pytest.raises(ParseError):
        parse_version("latest")
    # An unreadable configured version is not fatal: the mapping is chosen from the scrape.
    lab = {"UUID": "GPU-1", "gpu": "0", "Hostname": "h"}
    n = Normalizer().normalize([RawSample("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", lab, 2.0)], exporter_version="latest")
    assert n.mapping_version == "dcgm-v2" and n.devices[0]["pcie_tx_bytes_per_s"] == 2048.0 and n.warnings
