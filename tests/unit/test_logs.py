"""Logging set up once for a command: our INFO lines shown, third-party INFO (httpx per scrape) not."""

from __future__ import annotations

import subprocess
import sys

# A fresh process (no handler configured yet, as a command starts): set up logging, make one real
# httpx request (httpx logs each at INFO) and one gpuledger INFO line.
SCRIPT = """
import logging, sys
import httpx
from base.logs import configure_logging

configure_logging(verbose=sys.argv[1] == "verbose")
transport = httpx.MockTransport(lambda request: httpx.Response(200, text="DCGM_FI_DEV_GPU_UTIL 1"))
with httpx.Client(transport=transport) as client:
    client.get("http://node-1:9400/metrics")
logging.getLogger("gpuledger.processors").info("processor line")
logging.getLogger("producers.scraper").info("scraper line")
"""


def _stderr(mode: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stderr


def test_third_party_info_is_quiet_and_ours_is_not() -> None:
    err = _stderr("quiet")
    assert "HTTP Request" not in err and "httpx" not in err
    assert "INFO gpuledger.processors: processor line" in err
    assert "INFO producers.scraper: scraper line" in err


def test_verbose_lets_third_party_loggers_speak() -> None:
    err = _stderr("verbose")
    assert "INFO httpx: HTTP Request: GET http://node-1:9400/metrics" in err
    assert "INFO gpuledger.processors: processor line" in err

