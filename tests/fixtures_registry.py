"""Schema registry fixtures (a pytest plugin, listed in tests/conftest.py).

local_registry    the real registry of the local stack (Apicurio Registry, stack/registry.py) on
                  a free loopback port with a temporary H2 file database: one per session, started on
                  first use (about 5 s warm; the first run ever fetches ~105 MB with Maven).
                  `local_registry.stop(); local_registry.start()` restarts it on the same data.
registry_url      its Confluent-compatible API, `http://127.0.0.1:<port>/apis/ccompat/v7`.
registry_prefix   a fresh topic prefix (`t<hex>.`): its subjects are this test's alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from base.settings import Settings
from stack.registry import LocalRegistry, RegistryConfig


@pytest.fixture(scope="session")
def local_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    from stack.broker import free_ports

    cfg = RegistryConfig(
        data_dir=tmp_path_factory.mktemp("registry"),
        port=free_ports(1)[0],
        version=Settings().registry.version,
    )
    with LocalRegistry(cfg) as registry:
        yield registry


@pytest.fixture
def registry_url(local_registry: LocalRegistry) -> str:
    if local_registry.pid is None:  # a test that restarted it failed half-way: start it again
        local_registry.start()
    return local_registry.url


@pytest.fixture
def registry_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}."
