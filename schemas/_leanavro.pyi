from typing import Any

class Plan:
    def __init__(
        self,
        fields: tuple[tuple[str | None, int], ...],
        error: type[Exception],
        label: str,
    ) -> None: ...
    def decode(self, data: bytes, pos: int) -> dict[str, Any]: ...
    def encode(self, record: dict[str, Any]) -> bytes | None: ...
