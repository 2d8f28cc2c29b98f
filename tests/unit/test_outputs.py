"""Masking of secrets in text, data, errors and logs; CSV cells a spreadsheet would evaluate."""

from __future__ import annotations

import csv
import io
import logging

import pytest

from base.errors import ConfigError, ServiceError
from base.outputs import MASK, csv_cell, csv_text, install_log_masking, is_secret_name, mask_data, mask_text


@pytest.mark.parametrize(
    ("text", "secret", "kept"),
    [
        ("https://bob:hunter2@ch.example:8443/db", "hunter2", "ch.example:8443/db"),
        ("https://bob:hunter2@ch.example:8443/db", "bob", "https://"),
        ("json://hooks.example/x?token=T0KEN&channel=gpu", "T0KEN", "channel=gpu"),
        ("https://r.example/p.csv?X-Amz-Signature=abc123&X-Amz-Expires=60", "abc123", "X-Amz-Expires=60"),
        ("https://maps.example/api?key=AIzaSECRET&q=x", "AIzaSECRET", "q=x"),
        ("https://blob.example/c?sv=1&sig=SIGVALUE", "SIGVALUE", "sv=1"),
        ("GET /?user=analyst&password=pw42&query=SELECT+1 HTTP/1.1", "pw42", "user=analyst"),
        ('sasl.jaas.config=x required username="u" password="jaaspw";', "jaaspw", 'username="u"'),
        ("{'api_key': 'k-123', 'team': 'vision'}", "k-123", "'team': 'vision'"),
        ('{"client_secret": "cs-9", "id": 1}', "cs-9", '"id": 1'),
        ("Authorization: Bearer abc.def.ghi", "abc.def.ghi", "Authorization"),
        ("x-clickhouse-key: chkey", "chkey", "x-clickhouse-key"),
    ],
)
def test_mask_text_hides_logins_and_secret_parameters(text: str, secret: str, kept: str) -> None:
    masked = mask_text(text)
    assert secret not in masked and MASK in masked
    assert kept in masked  # the rest stays readable
    assert mask_text(masked) == masked  # masking twice changes nothing


@pytest.mark.parametrize(
    "text",
    [
        "record key=sim/n1 partition=3 offset=7",  # a Kafka key in a log line is not a secret
        "signal sig=USR1 sent to job 42",
        "http://127.0.0.1:8123/ping: HTTP 200",
        "ssl.ca.location=/etc/ca.pem",
    ],
)
def test_mask_text_leaves_ordinary_text_alone(text: str) -> None:
    assert mask_text(text) == text


def test_secret_names() -> None:
    secret = ("password", "sasl.password", "ssl.key.password", "basic.auth.user.info", "api_key", "apiKey",
              "access_token", "client-secret", "sasl.jaas.config", "ssl.key.pem", "X-Amz-Signature", "sig")  # fmt: skip
    for name in secret:
        assert is_secret_name(name), name
    for name in ("bootstrap.servers", "ssl.ca.location", "ssl.key.location", "password_file", "team", "url"):
        assert not is_secret_name(name), name
    assert not is_secret_name("key", strict=False) and is_secret_name("key")


def test_mask_data_masks_secret_keys_and_strings_inside() -> None:
    data = {
        "registry": {"url": "https://u:regpw@reg.example/?access_token=tok1", "api_key": "k1", "timeout_s": 5},
        "webhooks": ["json://h.example/x?token=tok2", 3, None],
        "password": "",
        "db_password_file": "/run/secrets/db",
    }
    masked = mask_data(data)
    text = str(masked)
    for secret in ("regpw", "tok1", "k1", "tok2"):
        assert secret not in text
    assert masked["registry"]["api_key"] == MASK and masked["registry"]["timeout_s"] == 5
    assert masked["registry"]["url"] == f"https://{MASK}@reg.example/?access_token={MASK}"
    assert masked["password"] == ""  # nothing to hide: an empty value says it is unset
    assert masked["db_password_file"] == "/run/secrets/db"  # where the secret is, not the secret


def test_error_messages_are_masked_wherever_they_are_shown() -> None:
    exc = ConfigError("cannot fetch project registry https://r.example/p.csv?token=ERRTOKEN: 403")
    assert "ERRTOKEN" not in str(exc) and "r.example/p.csv" in str(exc)
    assert "s3cr3t" not in f"{ServiceError('cannot reach http://w:s3cr3t@ch:8123')}"


def test_log_records_are_masked(caplog: pytest.LogCaptureFixture) -> None:
    previous = logging.getLogRecordFactory()
    try:
        install_log_masking()
        install_log_masking()  # idempotent: one wrapper, not two
        log = logging.getLogger("gpuledger.test")
        with caplog.at_level(logging.INFO, logger="gpuledger.test"):
            log.info("posting to %s", "https://hooks.example/x?token=LOGTOKEN")
            try:
                raise RuntimeError("connect failed for http://bob:TBPW@db.example")
            except RuntimeError:
                log.exception("delivery failed")
        handler = logging.StreamHandler(io.StringIO())
        handler.setFormatter(logging.Formatter("%(message)s"))
        for record in caplog.records:
            handler.emit(record)
        text = handler.stream.getvalue()
        assert "LOGTOKEN" not in text and "TBPW" not in text
        assert "hooks.example" in text and "RuntimeError" in text  # the traceback is still there
    finally:
        logging.setLogRecordFactory(previous)


@pytest.mark.parametrize(
    ("cell", "safe"),
    [
        ('=HYPERLINK("http://x")', '\'=HYPERLINK("http://x")'),
        ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"),
        ("-2+3+cmd|' /C calc'!A0", "'-2+3+cmd|' /C calc'!A0"),
        ("@SUM(1+1)", "'@SUM(1+1)"),
        ("\t=1", "'\t=1"),
        ("\r=1", "'\r=1"),
        ("-", "'-"),
        ("-12.50", "-12.50"),  # a number stays a number
        ("+1e3", "+1e3"),
        ("vision-seg", "vision-seg"),
        ("a=b", "a=b"),
        (-3, -3),
        (None, None),
    ],
)
def test_csv_cell_neutralises_formulas(cell: object, safe: object) -> None:
    assert csv_cell(cell) == safe


def test_csv_text_round_trips_with_neutralised_cells() -> None:
    text = csv_text(["project", "charge"], [["=evil()", "-1.5"], ["ok, quoted", 2]])
    assert list(csv.reader(io.StringIO(text))) == [["project", "charge"], ["'=evil()", "-1.5"], ["ok, quoted", "2"]]
