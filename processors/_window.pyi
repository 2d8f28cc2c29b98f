from typing import Any

class Window:
    index: int | None
    model: str | None
    mig_profile: str | None
    mapping: str
    minute_s: int
    @property
    def secs(self) -> dict[int, tuple[float | None, float | None, float | None]]: ...
    def put(self, second: int, act: float | None, fb: float | None, pw: float | None, /) -> bool: ...
    def count(self) -> int: ...

class Scrape:
    @property
    def cluster(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def ts_ms(self) -> int: ...
    @property
    def mapping_version(self) -> str: ...
    @property
    def devices(self) -> int: ...

class ScrapeReader:
    def __init__(
        self,
        fields: tuple[tuple[int, int], ...],
        items: tuple[tuple[int, int], ...],
        error: type[Exception],
        label: str,
    ) -> None: ...
    def read(self, data: bytes, pos: int, /) -> Scrape: ...

def span_stats(
    window: Window, i0: int, i1: int, /
) -> tuple[int, int, float, float | None, float | None, float | None, float, int]: ...
def absorb(
    scrape: Scrape,
    key: str,
    devices: dict[tuple[str, str, int | None], Any] | None,
    second: int,
    window_type: type[Window],
    last_seen: dict[tuple[str, str, int | None], int],
    index_of: dict[tuple[str, str, int | None], int | None],
    unchecked: list[tuple[str, str, int | None]],
    keys: dict[str, tuple[tuple[str, str, int | None], ...]],
    /,
) -> None: ...
