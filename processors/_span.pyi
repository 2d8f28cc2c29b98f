from typing import Any

def span_stats(
    act: Any, fb: Any, pw: Any, seen: Any, i0: int, i1: int, /
) -> tuple[int, int, float, float | None, float | None, float | None, float, int]: ...
