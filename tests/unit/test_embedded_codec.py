"""Request-body decoders of the embedded ClickHouse server: frames split anywhere, concatenated."""

from __future__ import annotations

import gzip
import zlib

import lz4.frame
import pytest
import zstandard

from sinks.embedded.codec import decoder_for
from sinks.embedded.engine import QueryFailed

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
    out = b"".join(decoder.feed(body[i : i + piece]) for i in range(0, len(body), piece))
    decoder.finish()
    assert out == b"".join(PARTS)


def test_identity_and_unknown() -> None:
    assert decoder_for(None).feed(b"x") == b"x"
    assert decoder_for("identity").feed(b"y") == b"y"
    with pytest.raises(QueryFailed) as err:
        decoder_for("snappy")
    assert err.value.code == 48


def test_truncated_and_corrupt_bodies_fail() -> None:
    decoder = decoder_for("lz4")
    decoder.feed(lz4.frame.compress(b"abc" * 100)[:-5])
    with pytest.raises(QueryFailed) as err:
        decoder.finish()
    assert err.value.code == 354
    with pytest.raises(QueryFailed):
        decoder_for("zstd").feed(b"\x28\xb5\x2f\xfd" + b"\xff" * 32)
