"""The embedded ClickHouse's HTTP front under hostile clients: a server of its own with small limits.

A client that trickles its headers is cut off at the header deadline; connections beyond the cap get
one ClickHouse error and a hang-up while the others keep working; a request without insert data is
limited to `clickhouse.max_query_kb`; a compressed insert that expands past the body limit is refused
without the server's memory growing by the expansion.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures_clickhouse import ClickHouseServer, server_env, start_server, stop_server

pytestmark = pytest.mark.integration


@pytest.fixture
def small_server(tmp_path: Path) -> Iterator[ClickHouseServer]:
    env = server_env(
        GPULEDGER_STATE_DIR=str(tmp_path / "state"),
        GPULEDGER_CLICKHOUSE__MAX_CONNECTIONS="4",
        GPULEDGER_CLICKHOUSE__MAX_QUERY_KB="64",
    )
    server = start_server(tmp_path / "data", "--max-body-mb", "32", env=env)
    try:
        yield server
    finally:
        stop_server(server)


def _auth(server: ClickHouseServer) -> str:
    return "Basic " + base64.b64encode(f"{server.user}:{server.password}".encode()).decode()


def _post(server: ClickHouseServer, body: bytes, path: str = "/", **headers: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
    try:
        conn.request("POST", path, body=body, headers={"Authorization": _auth(server), **headers})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_headers_trickled_byte_by_byte_are_cut_off(small_server: ClickHouseServer) -> None:
    with socket.create_connection((small_server.host, small_server.port), timeout=30) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\n")
        started = time.monotonic()
        closed_after = None
        for _ in range(40):  # one header byte a second: each recv is quick, the whole never ends
            try:
                sock.sendall(b"X")
                time.sleep(1.0)
                sock.setblocking(False)
                try:
                    if sock.recv(1) == b"":
                        closed_after = time.monotonic() - started
                        break
                except BlockingIOError:
                    pass
                finally:
                    sock.setblocking(True)
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
        assert closed_after is not None, "the server kept a trickling client for 40 s"
        assert closed_after < 15  # header deadline 10 s, swept every 0.5 s
    assert _post(small_server, b"SELECT 1")[2] == b"1\n"  # the server itself is fine


def test_connections_beyond_the_cap_get_one_error(small_server: ClickHouseServer) -> None:
    idle = [socket.create_connection((small_server.host, small_server.port), timeout=30) for _ in range(4)]
    try:
        time.sleep(0.5)
        with socket.create_connection((small_server.host, small_server.port), timeout=30) as extra:
            extra.sendall(b"POST / HTTP/1.1\r\nContent-Length: 8\r\n\r\nSELECT 1")
            answer = b""
            while chunk := extra.recv(4096):
                answer += chunk
        assert b"X-ClickHouse-Exception-Code: 202" in answer and b"TOO_MANY_SIMULTANEOUS" in answer
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the slots come back once the idle clients leave
        status, _, body = _post(small_server, b"SELECT 2")
        if status == 200:
            break
        time.sleep(0.2)
    assert body == b"2\n"


def test_a_query_without_insert_data_is_small(small_server: ClickHouseServer) -> None:
    padding = b" " * (70 << 10)
    status, headers, _ = _post(small_server, b"SELECT 1" + padding)
    assert headers.get("x-clickhouse-exception-code") == "290"
    status, headers, body = _post(small_server, b"SELECT 1" + b" " * (60 << 10))
    assert (status, body) == (200, b"1\n")


def test_a_compression_bomb_insert_is_refused_without_the_expansion_in_memory(small_server: ClickHouseServer) -> None:
    assert _post(small_server, b"CREATE TABLE bomb (s String) ENGINE = MergeTree ORDER BY s")[0] == 200
    before = _peak_rss_mib(small_server.process.pid)
    expanded = b"INSERT INTO bomb FORMAT TabSeparated\n" + b"\0" * (512 << 20)
    body = gzip.compress(expanded, compresslevel=1)
    assert len(body) < 4 << 20
    status, headers, _ = _post(small_server, body, **{"Content-Encoding": "gzip"})
    assert headers.get("x-clickhouse-exception-code") == "290", (status, headers)
    growth = _peak_rss_mib(small_server.process.pid) - before
    assert growth < 200, f"peak RSS grew by {growth:.0f} MiB for a 32 MiB limit"
    assert _post(small_server, b"SELECT count() FROM bomb")[2] == b"0\n"


def test_limits_do_not_get_in_the_way_of_a_normal_insert(small_server: ClickHouseServer, tmp_path: Any) -> None:
    assert _post(small_server, b"CREATE TABLE ok (n UInt64) ENGINE = MergeTree ORDER BY n")[0] == 200
    rows = b"".join(b"%d\n" % i for i in range(200_000))  # 1.3 MB: past max_query_kb, inside the body limit
    status, _, body = _post(small_server, gzip.compress(b"INSERT INTO ok FORMAT TSV\n" + rows),
                            **{"Content-Encoding": "gzip"})
    assert status == 200, body
    assert _post(small_server, b"SELECT count() FROM ok")[2] == b"200000\n"
