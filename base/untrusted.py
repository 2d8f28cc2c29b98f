"""Bounds shared by the parsers of untrusted input (scrapes, scheduler output, spool files, objects).

Each parser checks its own lengths, counts and ranges against these limits before it allocates;
`parses_untrusted` is the net under those checks: at a parser's entry, whatever its code lets out on
input it did not expect (a wrong type, a bad number, a missing key, nesting too deep) becomes one
`ParseError` naming the input, so a caller catches one class and dead-letters or quarantines the record.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from base.errors import GpuledgerError, ParseError

_P = ParamSpec("_P")
_R = TypeVar("_R")

UNEXPECTED_INPUT_ERRORS = (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError, RecursionError)
MAX_MESSAGE = 2000


def parses_untrusted(what: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorate a parser: `UNEXPECTED_INPUT_ERRORS` become `ParseError("<what>: <class>: <message>")`, chained."""

    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(fn)
        def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return fn(*args, **kwargs)
            except GpuledgerError:
                raise
            except UNEXPECTED_INPUT_ERRORS as exc:
                raise ParseError(f"{what}: {type(exc).__name__}: {exc}"[:MAX_MESSAGE]) from exc

        return guarded

    return decorate


def small_int(text: str, what: str, limit: int) -> int:
    """A decimal in ASCII digits, at most `limit`; anything else is a `ParseError` (no int() of 5,000 digits,
    no Unicode digits that `str.isdigit` accepts and `int` refuses)."""
    if not text or len(text) > 19 or not (text.isascii() and text.isdigit()):
        raise ParseError(f"{what}: {text[:40]!r} is not a number")
    n = int(text)
    if n > limit:
        raise ParseError(f"{what}: {n} is over the limit of {limit}")
    return n
