"""The local stack's components, in start order: the one list `gpuledger up/down/status` works from.

To add a component, append a `Component` to `COMPONENTS` (keep start order: what others need
comes first). A component is a long-running process (or, with `oneshot=True`, a step that runs to
completion, like applying topics). Most run a `gpuledger` sub-command: name it in `command` and
build the argv with `gpuledger_argv`; while that sub-command is not registered, status shows the
component as *unavailable* instead of starting it. Each process gets the environment of `up`
plus `GPULEDGER_STATE_DIR`, so it builds the same `Settings`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from base.metrics import instance_name
from base.outputs import mask_text
from base.settings import Settings
from stack import broker, registry, security

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Health:
    """The answer of a readiness check: healthy or not, and one line saying why."""

    ok: bool
    detail: str


def _always(_: Settings) -> bool:
    return True


@dataclass(frozen=True)
class Component:
    """One process of the local stack.

    name: short, unique; names the pid file and the log file.
    argv: the command line from the settings. It may do foreground work first (the broker fetches
      its jars and formats storage), reporting through `progress`.
    ready: whether the running component serves; `None` means a live process is enough.
    enabled: whether this configuration wants the component at all.
    command: the `gpuledger` sub-command it runs (availability check), if any.
    oneshot: runs to completion during `up` (exit 0 is success) instead of staying up.
    status_ready: the readiness check `status` uses (it must change nothing); default `ready`.
    """

    name: str
    description: str
    argv: Callable[[Settings, Progress], list[str]]
    ready: Callable[[Settings], Health] | None = None
    enabled: Callable[[Settings], bool] = _always
    command: tuple[str, ...] | None = None
    oneshot: bool = False
    ready_timeout_s: float = 60.0
    stop_timeout_s: float = 20.0
    status_ready: Callable[[Settings], Health] | None = None
    # Components of one stop group stop at once (`down`): the nodes of a KRaft cluster, whose last node would
    # otherwise wait out its timeout for a controller quorum that already left.
    stop_group: str | None = None
    # With broker.security = sasl_ssl, the Kafka principal the process logs in as (stack/security.py
    # PRINCIPALS: producers, processors, sinks, chat, reclaim, admin); None: the default login.
    kafka_principal: str | None = None
    # Which process of its kind this is (processor.instances): its metrics endpoint is recorded under its own name.
    instance: int = 1
    # Why this configuration does not want it, in one line for `status` (None: the generic line).
    why_disabled: Callable[[Settings], str] | None = None

    def env(self, settings: Settings) -> dict[str, str]:
        """What this component's process gets on top of `up`'s environment: its Kafka login, the local
        registry's URL when that is the stack's registry (so every component writes Confluent's wire format
        and resolves the ids it reads), and which process of its kind it is."""
        env = security.component_env(settings, self.kafka_principal)
        if settings.registry_local:
            env["GPULEDGER_KAFKA__SCHEMA_REGISTRY_URL"] = settings.registry.url
        if self.instance > 1:
            env["GPULEDGER_METRICS__INSTANCE"] = str(self.instance)
        return env


def gpuledger_argv(*args: str) -> list[str]:
    """Run a `gpuledger` sub-command with this interpreter (works without the console script)."""
    return [sys.executable, "-c", "from gpuledger.cli import main; main()", *args]


# ------------------------------------------------------------------------------------------------
# Readiness checks


def kafka_ready(settings: Settings) -> Health:
    if security.enabled(settings):
        return Health(*security.broker_ready(settings))
    ok = broker.metadata_ok(settings.kafka.client_config(), timeout=3.0)
    where = settings.kafka.bootstrap_servers
    return Health(ok, f"answers metadata at {where}" if ok else f"no metadata answer from {where}")


def kafka_ready_for_up(settings: Settings) -> Health:
    """`kafka_ready`, and with SASL_SSL on, (re)creates the pipeline's Kafka user through the admin login,
    then each component's own user and its ACLs."""
    if security.enabled(settings):
        health = Health(*security.broker_ready(settings, create_user=True))
        if health.ok:
            security.ensure_component_principals(settings)
        return health
    return kafka_ready(settings)


def clickhouse_ready(settings: Settings) -> Health:
    url = settings.clickhouse.url.rstrip("/") + "/ping"
    shown = mask_text(url)  # a login in clickhouse.url stays out of `status`
    try:
        resp = httpx.get(url, timeout=2.0)
    except httpx.HTTPError as exc:
        return Health(False, f"{shown}: {type(exc).__name__}")
    ok = resp.status_code == 200
    return Health(ok, f"{shown}: HTTP {resp.status_code}")


def web_ready(settings: Settings) -> Health:
    host = settings.web.host if settings.web.host not in ("0.0.0.0", "::") else "127.0.0.1"  # noqa: S104
    url = f"http://{host}:{settings.web.port}/healthz"
    try:
        resp = httpx.get(url, timeout=2.0)
    except httpx.HTTPError as exc:
        return Health(False, f"{url}: {type(exc).__name__}")
    return Health(resp.status_code == 200, f"{url}: HTTP {resp.status_code}")


def registry_ready(settings: Settings) -> Health:
    health = registry.check(settings.registry_url or settings.registry.url)
    return Health(health.ok, health.detail)


# ------------------------------------------------------------------------------------------------
# Command lines


def _broker_argv(node: int) -> Callable[[Settings, Progress], list[str]]:
    def argv(settings: Settings, progress: Progress) -> list[str]:
        cfg = broker.BrokerConfig.from_settings(settings, node)
        if security.enabled(settings):  # one node only (Settings refuses a secured cluster)
            cfg = security.prepare_local_broker(settings, cfg, progress=progress)
        return broker.prepare(cfg, progress=progress)

    return argv


def _broker_ready(node: int) -> Callable[[Settings], Health]:
    """While `up` starts them: a node of a cluster before the last cannot answer alone (no quorum yet),
    its live process is enough; the last node (the only one of a single broker) waits for the cluster,
    every node listed in its metadata."""

    def ready(settings: Settings) -> Health:
        nodes = settings.broker.nodes
        if node < nodes:
            return Health(True, f"node {node} started; the cluster answers once node {nodes} is up")
        if nodes == 1:
            return kafka_ready_for_up(settings)
        live = broker.live_brokers(settings.kafka.client_config(), timeout=3.0)
        ok = set(range(1, nodes + 1)) <= live
        return Health(ok, f"nodes {sorted(live)} of {nodes} registered at {settings.kafka.bootstrap_servers}")

    return ready


def _broker_status(node: int) -> Callable[[Settings], Health]:
    """For `status`: this node answers metadata at its own address and is registered (unfenced)."""

    def ready(settings: Settings) -> Health:
        if settings.broker.nodes == 1:
            return kafka_ready(settings)
        port = settings.broker.node_ports(node)[0]
        where = f"{settings.broker.host}:{port}"
        live = broker.live_brokers({**settings.kafka.client_config(), "bootstrap.servers": where}, timeout=3.0)
        ok = node in live
        return Health(ok, f"node {node} {'registered, answers' if ok else 'not serving'} at {where}")

    return ready


def _registry_argv(settings: Settings, progress: Progress) -> list[str]:
    return registry.prepare(registry.RegistryConfig.from_settings(settings), progress=progress)


def _clickhouse_argv(settings: Settings, progress: Progress) -> list[str]:
    security.ensure_clickhouse_passwords(settings, progress=progress)  # the server refuses empty ones
    ch = settings.clickhouse
    return gpuledger_argv(
        "clickhouse", "serve", "--path", str(settings.clickhouse_path), "--host", ch.host, "--port", str(ch.port)
    )


def _simulated(settings: Settings) -> bool:
    # No real source configured: the cluster is the simulator's.
    return settings.cluster == "sim"


# The simulated organisation's policy (producers/simulator/org.py writes it; a unit test keeps them equal).
SIM_POLICY = Path(__file__).resolve().parents[1] / "deploy" / "policy.sim.yaml"


def demo_policy(settings: Settings) -> Path | None:
    """The policy `up` runs the simulator with when none is configured: deploy/policy.sim.yaml in a checkout, else
    (an installed package has no deploy/) the same text written into the state directory. None: a policy is
    configured, or the source is real (an explicit `policy_path` or a real cluster wins)."""
    if settings.policy_path is not None or not _simulated(settings):
        return None
    if SIM_POLICY.is_file():
        return SIM_POLICY
    from producers.simulator.org import sim_policy_text

    written = settings.state_dir / "policy.sim.yaml"
    text = sim_policy_text()
    if not written.is_file() or written.read_text(encoding="utf-8") != text:
        written.parent.mkdir(parents=True, exist_ok=True)
        written.write_text(text, encoding="utf-8")
    return written


def with_demo_policy(settings: Settings) -> Settings:
    """`settings` with the simulator's policy filled in where `demo_policy` gives one (`up`, `status`, `down` and
    every component they start see the same policy: the supervisor passes it on as GPULEDGER_POLICY_PATH)."""
    path = demo_policy(settings)
    if path is not None:
        settings.policy_path = path
    return settings


SIMULATOR_BACKFILL_S = 3 * 3600


def _local_chat(settings: Settings) -> bool:
    # No chat route configured: alerts go to a local webhook receiver so a demo shows them.
    chat = settings.sinks.chat
    return chat.default is None and not chat.users and not chat.teams


def _reservation_engine(settings: Settings) -> bool:
    # The reservation service renders onto a scheduler: only with an engine configured (and the policy its rules
    # come from). Without one there is nothing to put on or take off; the statement charges a reservation to its
    # end either way.
    return bool(settings.sinks.reservations.engines) and settings.policy_path is not None


def _escalation_engine(settings: Settings) -> bool:
    # The escalation service raises granted jobs on a scheduler: only with an engine configured and the policy its
    # rules come from. Without one, escalations are still asked, decided and listed; nothing is raised.
    return bool(settings.sinks.escalations.engines) and settings.policy_path is not None


def _escalations_off(settings: Settings) -> str:
    if settings.policy_path is None:
        return "no policy_path"
    return "no engine configured (sinks.escalations.engines): escalations are asked, decided and listed, not raised"


def _processors_argv(settings: Settings, _: Progress) -> list[str]:
    if _simulated(settings):
        # The simulator replays hours of history at start-up: event time alone closes its windows,
        # or the wall clock would call all that history late.
        return gpuledger_argv("processors", "run", "--event-time")
    return gpuledger_argv("processors", "run")


def _agents_argv(settings: Settings, _: Progress) -> list[str]:
    # Event time with the simulator, for the reason above.
    if _simulated(settings):
        return gpuledger_argv("processors", "agents", "--event-time")
    return gpuledger_argv("processors", "agents")


def _chat_argv(settings: Settings, _: Progress) -> list[str]:
    if _local_chat(settings):
        return gpuledger_argv("chat", "run", "--local-receiver", str(settings.sinks.chat.local_receiver_port))
    return gpuledger_argv("chat", "run")


def _broker_node(node: int) -> Component:
    """Node `node` of the local broker: "broker" (the single node, or node 1 of three), "broker-2", "broker-3"."""
    return Component(
        name="broker" if node == 1 else f"broker-{node}",
        description="Apache Kafka, KRaft on loopback: the single node, or node 1 of broker.nodes"
        if node == 1
        else f"Apache Kafka, KRaft node {node} of the loopback cluster (broker.nodes = 3)",
        argv=_broker_argv(node),
        ready=_broker_ready(node),
        status_ready=_broker_status(node),
        enabled=lambda s: s.broker.enabled and s.broker.nodes >= node,
        ready_timeout_s=120.0,
        stop_timeout_s=30.0,
        stop_group="broker",
    )


BROKER_NODES = (1, 2, 3)


# The processor kinds `up` starts processor.instances of: (description, argv, sub-command).
PROCESSOR_KINDS = {
    "processors": (
        "stream processors: allocations (rekey), node windows, attribution, classification, coverage",
        _processors_argv,
        ("processors", "run"),
    ),
    "agents": (
        "the job stage as faust agents: job-minutes, idle detection, alerts, reclaim actions",
        _agents_argv,
        ("processors", "agents"),
    ),
}


def _processor_process(kind: str, k: int) -> Component:
    """Process `k` of a processor kind (processor.instances): "processors", "processors-2", ..., "agents", ..."""
    description, argv, command = PROCESSOR_KINDS[kind]
    return Component(
        name=instance_name(kind, k),
        description=description + ("" if k == 1 else f" (process {k} of processor.instances)"),
        argv=argv,
        enabled=lambda s: s.processor.instances >= k,
        command=command,
        kafka_principal="processors",
        instance=k,
    )


PROCESSOR_INSTANCES = (1, 2, 3, 4)  # processor.instances allows up to 4

COMPONENTS: list[Component] = [
    *(_broker_node(k) for k in BROKER_NODES),
    Component(
        name="registry",
        description="schema registry (Apicurio Registry, Confluent-compatible API) on loopback",
        argv=_registry_argv,
        ready=registry_ready,
        enabled=lambda s: s.registry_local,
        ready_timeout_s=120.0,
    ),
    Component(
        name="clickhouse",
        description="embedded ClickHouse (chDB behind the HTTP interface)",
        argv=_clickhouse_argv,
        ready=clickhouse_ready,
        enabled=lambda s: s.clickhouse.embedded,
        command=("clickhouse", "serve"),
    ),
    Component(
        name="topics",
        description="create/update the Kafka topics",
        argv=lambda s, _: gpuledger_argv("topics", "apply"),
        command=("topics", "apply"),
        kafka_principal="admin",
        oneshot=True,
    ),
    Component(
        name="schemas",
        description="register every subject's history in the schema registry (BACKWARD)",
        argv=lambda s, _: gpuledger_argv("schemas", "register"),
        enabled=lambda s: s.registry_local,
        command=("schemas", "register"),
        oneshot=True,
    ),
    *(_processor_process(kind, k) for kind in PROCESSOR_KINDS for k in PROCESSOR_INSTANCES),
    Component(
        name="db-migrate",
        description="apply the ClickHouse migrations",
        argv=lambda s, _: gpuledger_argv("db", "migrate"),
        command=("db", "migrate"),
        oneshot=True,
    ),
    Component(
        name="ratecard",
        description="load the rate card into ClickHouse",
        argv=lambda s, _: gpuledger_argv("ratecard", "load"),
        command=("ratecard", "load"),
        oneshot=True,
    ),
    Component(
        name="sinks",
        description="ledger topics to ClickHouse (idempotent)",
        argv=lambda s, _: gpuledger_argv("sink", "run"),
        command=("sink", "run"),
        kafka_principal="sinks",
    ),
    Component(
        name="chat-receiver",
        description="local webhook that stands in for chat (no route configured)",
        argv=lambda s, _: gpuledger_argv(
            "chat", "receiver", "--port", str(s.sinks.chat.local_receiver_port), "--out",
            str(s.state_dir / "webhook.jsonl"),
        ),
        enabled=_local_chat,
        command=("chat", "receiver"),
    ),
    Component(
        name="chat",
        description="alerts to chat, routed per user/team",
        argv=_chat_argv,
        command=("chat", "run"),
        kafka_principal="chat",
    ),
    Component(
        name="reclaim",
        description="reclaim executor (dry-run unless configured live)",
        argv=lambda s, _: gpuledger_argv("reclaim", "run"),
        command=("reclaim", "run"),
        kafka_principal="reclaim",
    ),
    Component(
        name="reservations",
        description="reservation service: approved reservations onto Slurm/Kueue, off at their end",
        argv=lambda s, _: gpuledger_argv("reserve", "run"),
        enabled=_reservation_engine,
        why_disabled=lambda s: "no policy_path" if s.policy_path is None else (
            "no engine configured (sinks.reservations.engines): reservations are recorded, approved and charged, "
            "not put onto a scheduler"),
        command=("reserve", "run"),
        kafka_principal="producers",  # the governance steps' login (security.component_acls)
    ),
    Component(
        name="appeals",
        description="appeals service: escalates appeals undecided past the policy's deadline",
        argv=lambda s, _: gpuledger_argv("appeal", "run"),
        enabled=lambda s: s.policy_path is not None,  # who decides, and by when, is the policy's
        why_disabled=lambda s: "no policy_path: no appeals without a policy",
        command=("appeal", "run"),
        kafka_principal="producers",  # the governance steps' login (security.component_acls)
    ),
    Component(
        name="escalations",
        description="escalation service: granted escalations raised on Slurm/Kueue, lowered when they expire",
        argv=lambda s, _: gpuledger_argv("escalate", "run"),
        enabled=_escalation_engine,
        why_disabled=_escalations_off,
        command=("escalate", "run"),
        kafka_principal="producers",  # the governance steps' login (security.component_acls)
    ),
    Component(
        name="policy-watch",
        description="policy watch: the engines diffed against the policy, drift alerted until it is gone",
        argv=lambda s, _: gpuledger_argv("policy", "watch"),
        enabled=lambda s: s.policy_path is not None and bool(s.policy_watch.engines),
        why_disabled=lambda s: "no policy_path" if s.policy_path is None else (
            "no engine configured (policy_watch.engines): nothing to diff the policy against"),
        command=("policy", "watch"),
        kafka_principal="policy-watch",  # alerts.v1 written, reservations.v1 read (security.component_acls)
    ),
    Component(
        name="simulator",
        description="simulated clusters sim (Slurm-like) and sim-k8s (Kubernetes) (no real source configured)",
        # Three hours of history first (reports and idle alerts to look at at once), then real time.
        argv=lambda s, _: gpuledger_argv("simulate", "run", "--backfill", str(SIMULATOR_BACKFILL_S)),
        enabled=_simulated,
        command=("simulate", "run"),
        kafka_principal="producers",
    ),
    Component(
        name="web",
        description="the team page (gpuledger web): reads as the analyst, publishes corrections",
        argv=lambda s, _: gpuledger_argv("web"),
        ready=web_ready,
        enabled=lambda s: s.web.enabled,
        command=("web",),
        kafka_principal="web",
    ),
]


def by_name(components: list[Component] | None = None) -> dict[str, Component]:
    return {c.name: c for c in (COMPONENTS if components is None else components)}
