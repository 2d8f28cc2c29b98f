"""What gpuledger shows people: secrets masked, CSV cells a spreadsheet would run neutralised.

- `mask_text` is the one masking function: the login part of any URL (`https://bob:pw@host` ->
  `https://**********@host`) and the value of every secret-named parameter (`?token=..`, `&sig=..`,
  `password="..."`, `"api_key": ".."`, `Authorization: Bearer ..`) become `**********`. It runs on
  `Settings.masked()` (the `extra` section included), on every `GpuledgerError` message and, once
  `install_log_masking()` ran (the `gpuledger` entry point does it), on every log record.
- `mask_data` does the same over JSON-like data: a secret-named key hides its whole value.
- `csv_cell` neutralises a text cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage
  return (a spreadsheet would evaluate it as a formula) by prefixing `'`, as OWASP recommends.
  Numbers are left alone: `-12.5` is a value, not a formula.
"""

from __future__ import annotations

import csv
import io
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MASK = "**********"

# A name is secret when it contains one of these ...
_SECRET_PART = re.compile(
    r"pass(?:word|wd|phrase)|secret|token|api_?key|signature|credential|jaas|user\.?info|oauthbearer|private",
    re.IGNORECASE,
)
# ... or one of its words (split on `.`, `_`, `-`) is one of these. `key` and `sig` also name
# harmless things in free text (a Kafka record's key): there they count only in a query string.
_SECRET_WORDS = frozenset({"pass", "pwd", "auth", "authorization", "sas"})
_QUERY_SECRET_WORDS = _SECRET_WORDS | {"key", "sig"}
_WORD_SPLIT = re.compile(r"[._\-\s]+")
_PATH_WORDS = frozenset({"location", "file", "path", "dir"})

# `scheme://user:password@` (a userinfo never holds `/`, `@` or whitespace unencoded).
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/@\s]+@")
# `name=value` in a query string, a command line or a log line; a quoted value is masked whole.
_ASSIGNMENT = re.compile(
    r"""(?P<name>(?<![\w.\-])[A-Za-z_][\w.\-]*)(?P<eq>\s*=\s*)(?P<value>"[^"]*"|'[^']*'|[^\s&#;,'"]*)"""
)
# `"name": "value"` as JSON or a Python repr prints it.
_QUOTED_PAIR = re.compile(r"""(?P<q>["'])(?P<name>[\w.\-]+)(?P=q)(?P<sep>\s*:\s*)(?P<value>"[^"]*"|'[^']*')""")
# HTTP credentials headers as they appear in a dumped request.
_AUTH_HEADER = re.compile(
    r"(?P<name>\b(?:proxy-)?authorization|\bx-clickhouse-key|\bx-api-key)(?P<sep>\s*:\s*)"
    r"(?P<value>(?:(?:basic|bearer|digest|token)\s+)?[^\s,;]+)",
    re.IGNORECASE,
)


def is_secret_name(name: str, *, strict: bool = True) -> bool:
    """Whether a setting, a query parameter or a field of this name holds a secret (it errs on the side
    of yes). `strict=False` is for names in free text, where `key=` and `sig=` are usually harmless."""
    words = [word.lower() for word in _WORD_SPLIT.split(name) if word]
    if words and words[-1] in _PATH_WORDS:
        return False  # `ssl.key.location`, `password_file`: where a secret is, not the secret
    if _SECRET_PART.search(name):
        return True
    secret_words = _QUERY_SECRET_WORDS if strict else _SECRET_WORDS
    return any(word in secret_words for word in words)


def _mask_assignment(m: re.Match[str]) -> str:
    in_query = m.start() > 0 and m.string[m.start() - 1] in "?&"
    if not (m.group("value") and is_secret_name(m.group("name"), strict=in_query)):
        return m.group(0)
    return f"{m.group('name')}{m.group('eq')}{_masked_value(m.group('value'))}"


def _mask_quoted_pair(m: re.Match[str]) -> str:
    if not is_secret_name(m.group("name"), strict=False):
        return m.group(0)
    q = m.group("q")
    return f"{q}{m.group('name')}{q}{m.group('sep')}{_masked_value(m.group('value'))}"


def _masked_value(value: str) -> str:
    quote = value[:1] if value[:1] in ("'", '"') else ""
    return f"{quote}{MASK}{quote}"


def mask_text(text: str) -> str:
    """`text` with URL logins and the values of secret-named parameters replaced by `**********`."""
    text = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
    text = _AUTH_HEADER.sub(lambda m: f"{m.group('name')}{m.group('sep')}{MASK}", text)
    text = _QUOTED_PAIR.sub(_mask_quoted_pair, text)
    return _ASSIGNMENT.sub(_mask_assignment, text)


def mask_data(value: Any, name: str = "") -> Any:
    """JSON-like data with every value under a secret-named key masked, and every string `mask_text`-ed."""
    if name and is_secret_name(name) and value not in (None, "", [], {}):
        return MASK
    if isinstance(value, Mapping):
        return {key: mask_data(item, str(key)) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [mask_data(item) for item in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


# ------------------------------------------------------------------------------------------------
# Logs


_FORMATTER = logging.Formatter()


def _mask_record(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a bad format/args pair: logging reports it when it emits the record
        return
    record.msg, record.args = mask_text(message), ()
    if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
        # Formatters reuse exc_text when it is set: the traceback is printed masked too.
        record.exc_text = mask_text(_FORMATTER.formatException(record.exc_info))
    if record.stack_info:
        record.stack_info = mask_text(record.stack_info)


def install_log_masking() -> None:
    """Mask every log record of this process (any logger, any handler) as it is made. Idempotent."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "_gpuledger_masking", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        _mask_record(record)
        return record

    factory._gpuledger_masking = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


# ------------------------------------------------------------------------------------------------
# CSV

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def csv_cell(value: Any) -> Any:
    """A cell safe to open in a spreadsheet: text that would start a formula gets a leading `'`."""
    if isinstance(value, str) and value.startswith(_FORMULA_START) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


def csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """CSV (header first, `\\n` line ends) with every cell passed through `csv_cell`."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([csv_cell(h) for h in header])
    writer.writerows([csv_cell(v) for v in row] for row in rows)
    return buf.getvalue()
