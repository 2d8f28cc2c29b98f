"""Request-body decoders of the embedded ClickHouse server: frames split anywhere, concatenated."""

from __future__ import annotations

import gzip
import zlib

import lz4.frame
import pytest
import zstandard

from stack.clickhouse.codec import decoder_for
from stack.clickhouse.engine import QueryFailed

PARTS = [b"INSERT INTO t FORMAT CSV\n", b"1,a\n" * 1000, b"2,b\n" * 10]
ENCODERS = {
    "lz4": lz4.frame.compress,
    "zstd": zstandard.compress,
    "gzip": gzip.compress,
    "deflate": zlib.compress,
}


@pytest.mark.parametrize("encoding", sorted(ENCODERS))
@pytest.mark.parametrize("piece", [1, 7, 4096])
def test_concatenated_frames_in_any_pieces(encoding: str, piece: int) -> None:
    body = b"".join(ENCODERS[encoding](part) for part in PARTS)  # one frame per block, as clients send
    decoder = decoder_for(encoding)
    out = b"".join(b"".join(decoder.feed(body[i : i + piece])) for i in range(0, len(body), piece))
    decoder.finish()
    assert out == b"".join(PARTS)


def test_identity_and_unknown() -> None:
    assert b"".join(decoder_for(None).feed(b"x")) == b"x"
    assert b"".join(decoder_for("identity").feed(b"y")) == b"y"
    with pytest.raises(QueryFailed) as err:
        decoder_for("snappy")
    assert err.value.code == 48


def test_truncated_and_corrupt_bodies_fail() -> None:
    decoder = decoder_for("lz4")
    b"".join(decoder.feed(lz4.frame.compress(b"abc" * 100)[:-5]))
    with pytest.raises(QueryFailed) as err:
        decoder.finish()
    assert err.value.code == 354
    with pytest.raises(QueryFailed):
        b"".join(decoder_for("zstd").feed(b"\x28\xb5\x2f\xfd" + b"\xff" * 32))


@pytest.mark.parametrize("encoding", sorted(ENCODERS))
def test_a_compression_bomb_decodes_in_bounded_steps(encoding: str) -> None:
    """256 MiB of zeros compress to a few hundred KiB; no single step may hand back more than ~32 MiB,
    so the body's limit is checked long before the whole expansion sits in memory."""
    bomb = ENCODERS[encoding](bytes(256 << 20))
    assert len(bomb) < 2 << 20
    steps = decoder_for(encoding).feed(bomb)
    largest = 0
    total = 0
    for piece in steps:
        largest = max(largest, len(piece))
        total += len(piece)
        if total > 64 << 20:  # what the server does at its limit: stop reading
            break
    assert largest <= 32 << 20
    assert total > 0
