"""Request-body content encodings (lz4, zstd, gzip, deflate, br), decoded incrementally.

clickhouse-connect compresses an insert as one frame per block, so every decoder here accepts a
concatenation of frames (or gzip members).
"""

from __future__ import annotations

import zlib
from typing import Any, Protocol

import lz4.frame
import zstandard

from sinks.embedded.engine import QueryFailed


class Decoder(Protocol):
    def feed(self, data: bytes) -> bytes: ...

    def finish(self) -> None: ...


class Identity:
    def feed(self, data: bytes) -> bytes:
        return data

    def finish(self) -> None:
        return None


class _Frames:
    """Decode a run of frames, starting a fresh decompressor at each frame end."""

    name = ""

    def __init__(self) -> None:
        self._current: Any = None
        self._midframe = False

    def _new(self) -> Any:
        raise NotImplementedError

    def feed(self, data: bytes) -> bytes:
        out = []
        try:
            while data:
                if self._current is None:
                    self._current = self._new()
                out.append(self._current.decompress(data))
                self._midframe = True
                if self._current.eof:
                    data = self._current.unused_data
                    self._current = None
                    self._midframe = False
                else:
                    data = b""
        except (RuntimeError, zlib.error, zstandard.ZstdError) as exc:
            raise QueryFailed.make(
                354, "CANNOT_DECOMPRESS", f"Cannot decode {self.name} request body: {exc}"
            ) from None
        return b"".join(out)

    def finish(self) -> None:
        if self._midframe:
            raise QueryFailed.make(354, "CANNOT_DECOMPRESS", f"The {self.name} request body ends inside a frame")


class Lz4(_Frames):
    name = "lz4"

    def _new(self) -> Any:
        return lz4.frame.LZ4FrameDecompressor()


class Zstd(_Frames):
    name = "zstd"

    def _new(self) -> Any:
        return zstandard.ZstdDecompressor().decompressobj()


class Gzip(_Frames):
    name = "gzip"

    def _new(self) -> Any:
        return zlib.decompressobj(wbits=31)


class Deflate(_Frames):
    name = "deflate"

    def _new(self) -> Any:
        return zlib.decompressobj()


class Brotli:
    def __init__(self) -> None:
        try:
            import brotli
        except ImportError:
            raise QueryFailed.make(
                48, "NOT_IMPLEMENTED", "Content-Encoding br needs the brotli package on the server"
            ) from None
        self._d = brotli.Decompressor()

    def feed(self, data: bytes) -> bytes:
        return bytes(self._d.process(data))

    def finish(self) -> None:
        return None


def decoder_for(encoding: str | None) -> Decoder:
    name = (encoding or "").strip().lower()
    if name in ("", "identity", "none"):
        return Identity()
    factories: dict[str, type[Any]] = {
        "lz4": Lz4,
        "zstd": Zstd,
        "gzip": Gzip,
        "x-gzip": Gzip,
        "deflate": Deflate,
        "br": Brotli,
    }
    factory = factories.get(name)
    if factory is None:
        raise QueryFailed.make(48, "NOT_IMPLEMENTED", f"Unknown Content-Encoding {encoding!r}")
    decoder: Decoder = factory()
    return decoder
