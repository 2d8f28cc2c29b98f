"""Request-body content encodings (lz4, zstd, gzip, deflate, br), decoded incrementally.

clickhouse-connect compresses an insert as one frame per block, so every decoder here accepts a
concatenation of frames (or gzip members).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any, Protocol

import lz4.frame
import zstandard

from stack.clickhouse.engine import QueryFailed

# The most decoded bytes one step may produce: the body's limit is checked between steps, so a small
# compressed body that expands to gigabytes stops at the limit instead of filling memory first.
STEP_OUT = 1 << 20
# zstd cannot bound a step's output, only its input; its best ratio is about 32,000:1, so 1 KiB of
# input expands to at most ~32 MiB.
_ZSTD_STEP_IN = 1024


class Decoder(Protocol):
    def feed(self, data: bytes) -> Iterator[bytes]: ...

    def finish(self) -> None: ...


class Identity:
    def feed(self, data: bytes) -> Iterator[bytes]:
        if data:
            yield data

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

    def _steps(self, data: bytes) -> Iterator[bytes]:
        """Decode `data` with the current decompressor in pieces of at most STEP_OUT bytes."""
        raise NotImplementedError

    def _after_frame(self, data: bytes) -> bytes:
        """The input that follows the frame that just ended."""
        return bytes(self._current.unused_data or b"")

    def feed(self, data: bytes) -> Iterator[bytes]:
        try:
            while data:
                if self._current is None:
                    self._current = self._new()
                self._midframe = True
                yield from self._steps(data)
                if self._current.eof:
                    data = self._after_frame(data)
                    self._current = None
                    self._midframe = False
                else:
                    data = b""
        except (RuntimeError, zlib.error, zstandard.ZstdError) as exc:
            raise QueryFailed.make(
                354, "CANNOT_DECOMPRESS", f"Cannot decode {self.name} request body: {exc}"
            ) from None

    def finish(self) -> None:
        if self._midframe:
            raise QueryFailed.make(354, "CANNOT_DECOMPRESS", f"The {self.name} request body ends inside a frame")


class Lz4(_Frames):
    name = "lz4"

    def _new(self) -> Any:
        return lz4.frame.LZ4FrameDecompressor()

    def _steps(self, data: bytes) -> Iterator[bytes]:
        d = self._current
        yield d.decompress(data, max_length=STEP_OUT)
        while not d.eof and not d.needs_input:
            yield d.decompress(b"", max_length=STEP_OUT)


class Zstd(_Frames):
    name = "zstd"

    def _new(self) -> Any:
        return zstandard.ZstdDecompressor().decompressobj()

    def _steps(self, data: bytes) -> Iterator[bytes]:
        d = self._current
        self._consumed = 0
        for at in range(0, len(data), _ZSTD_STEP_IN):
            self._consumed = at + _ZSTD_STEP_IN
            yield d.decompress(data[at : self._consumed])
            if d.eof:
                return

    def _after_frame(self, data: bytes) -> bytes:
        return bytes(self._current.unused_data or b"") + data[self._consumed :]


class _Zlib(_Frames):
    def _steps(self, data: bytes) -> Iterator[bytes]:
        d = self._current
        while True:
            out = d.decompress(data, STEP_OUT)
            yield out
            data = d.unconsumed_tail
            if d.eof or (not data and len(out) < STEP_OUT):
                return


class Gzip(_Zlib):
    name = "gzip"

    def _new(self) -> Any:
        return zlib.decompressobj(wbits=31)


class Deflate(_Zlib):
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

    def feed(self, data: bytes) -> Iterator[bytes]:
        yield bytes(self._d.process(data))

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
