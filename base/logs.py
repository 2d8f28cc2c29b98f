"""Logging for a gpuledger process, set up once where a long-running command starts.

Our own loggers (`gpuledger.*`, `producers.*`, `processors.*`, `sinks.*`) log at INFO, or DEBUG with
`--verbose`. Third-party libraries stay at WARNING unless `--verbose` is asked for: httpx logs every
request at INFO, so the dcgm scraper of a 1,000-node fleet would write 1,000 lines a second about
scrapes that went well. Every record is masked (`install_log_masking`) whoever emits it.
"""

from __future__ import annotations

import logging
import sys

from base.outputs import install_log_masking

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Libraries whose INFO lines are per request, per connection or per rebalance: warnings and errors only.
QUIET_LOGGERS = (
    "httpx",
    "httpcore",
    "urllib3",
    "requests",
    "kafka",
    "confluent_kafka",
    "aiokafka",
    "faust",
    "mode",
    "asyncio",
    "apprise",
    "kubernetes",
    "clickhouse_connect",
)


def configure_logging(verbose: bool = False) -> None:
    """Log to stderr at INFO (DEBUG when verbose); third-party loggers at WARNING unless verbose."""
    install_log_masking()
    level = logging.DEBUG if verbose else logging.INFO
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr)
    for name in QUIET_LOGGERS:
        # NOTSET: a verbose process lets the library log at the root's level (DEBUG), as it would by default.
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)
