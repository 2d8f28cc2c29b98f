"""A local Kubernetes control plane on loopback: etcd, kube-apiserver and the Kueue controller.

No kubelet, scheduler or controller-manager: objects are stored, validated (schemas, CEL, admission
policies), authorised by the real RBAC and watched, and Kueue admits, preempts and evicts Workloads.
A pod "runs" when created with `spec.nodeName` and its status patched (`--subresource=status`).

Layout of `state_dir` (all of it private to the cluster, removed or reused at will):
    etcd/                 the etcd data directory
    pki/                  the API server's serving certificates, the service-account key pair, the
                          Kueue webhook pair
    tokens.csv            one static bearer token per user (`token,user,uid,"group,..."`)
    kubeconfig-<user>     a kubeconfig per user (admin is `system:masters`; the others have no rights
                          until a ClusterRole is bound to them)
    kueue.yaml            the Kueue controller's configuration
    logs/<process>.log    each process's output
    pids.json             the processes of `gpuledger dev kube up` (read by `down`)

Users: `admin` plus one per component (`USERS`), so that tests and developers run each one with the
rights its ClusterRole gives and no more (deploy/kubernetes/rbac/).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from base.errors import ConfigError, ServiceError
from stack import recorded
from stack.broker import free_ports
from stack.kube.build import KubeBinaries

Progress = Callable[[str], None]

ADMIN = "admin"
# Component users (groups after the colon): each gets a token and a kubeconfig, and no rights until bound.
USERS = ("gpuledger-watcher", "gpuledger-reclaim", "gpuledger-policy", "gpuledger-reservations",
         "gpuledger-policy-watch", "gpuledger-escalations", "alice", "bob")
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")  # fixed in Kueue's main.go
KUEUE_FRAMEWORKS = ("batch/job", "jobset.x-k8s.io/jobset")
PROCESSES = ("etcd", "kube-apiserver", "kueue")
# The CRDs Kueue converts between v1beta1 and v1beta2 (`patches/webhook_in_*` enabled in its module's
# config/components/crd/kustomization.yaml).
KUEUE_CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class ClusterConfig:
    state_dir: Path
    etcd_port: int
    etcd_peer_port: int
    apiserver_port: int
    kueue_webhook_port: int
    kueue_health_port: int
    kueue_metrics_port: int
    users: tuple[str, ...] = USERS
    tokens: dict[str, str] = field(default_factory=dict, compare=False)  # filled by `write_tokens`

    @classmethod
    def on_free_ports(cls, state_dir: Path, users: tuple[str, ...] = USERS) -> ClusterConfig:
        etcd, peer, apiserver, webhook, health, metrics = free_ports(6)
        return cls(state_dir, etcd, peer, apiserver, webhook, health, metrics, users=users)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    def kubeconfig(self, user: str = ADMIN) -> Path:
        return self.state_dir / f"kubeconfig-{user}"

    def log(self, process: str) -> Path:
        return self.state_dir / "logs" / f"{process}.log"

    def to_json(self) -> dict[str, Any]:
        return {
            "state_dir": str(self.state_dir), "etcd_port": self.etcd_port, "etcd_peer_port": self.etcd_peer_port,
            "apiserver_port": self.apiserver_port, "kueue_webhook_port": self.kueue_webhook_port,
            "kueue_health_port": self.kueue_health_port, "kueue_metrics_port": self.kueue_metrics_port,
            "users": list(self.users),
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterConfig:
        data = dict(data)
        state_dir = Path(data.pop("state_dir"))
        users = tuple(data.pop("users"))
        return cls(state_dir, users=users, **data)


# ---------------------------------------------------------------------------------------------
# Files: keys, certificates, tokens, kubeconfigs, Kueue's configuration


def _self_signed(cert: Path, key: Path, host: str = "127.0.0.1") -> None:
    """A self-signed serving pair for `host` (PEM), for Kueue's webhook and metrics servers."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    pkey = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(pkey.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
        .sign(pkey, hashes.SHA256())
    )  # fmt: skip
    cert.parent.mkdir(parents=True, exist_ok=True)
    key.write_bytes(
        pkey.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                           serialization.NoEncryption())
    )  # fmt: skip
    key.chmod(0o600)
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


def _service_account_keys(pki: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    if (pki / "sa.key").is_file():
        return
    pki.mkdir(parents=True, exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (pki / "sa.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (pki / "sa.key").chmod(0o600)
    (pki / "sa.pub").write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def write_tokens(cfg: ClusterConfig) -> dict[str, str]:
    """tokens.csv (kept across restarts) and one kubeconfig per user; returns user -> token."""
    path = cfg.state_dir / "tokens.csv"
    tokens: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            token, user = line.split(",")[:2]
            tokens[user] = token
    for user in (ADMIN, *cfg.users):
        tokens.setdefault(user, secrets.token_hex(16))
    lines = [f'{tokens[ADMIN]},{ADMIN},{ADMIN},"system:masters"']
    lines += [f"{tokens[u]},{u},{u}" for u in cfg.users]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path.chmod(0o600)
    for user, token in tokens.items():
        kubeconfig = {
            "apiVersion": "v1", "kind": "Config", "current-context": "local",
            "clusters": [{"name": "local", "cluster": {"server": cfg.server, "insecure-skip-tls-verify": True}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        }  # fmt: skip
        cfg.kubeconfig(user).write_text(yaml.safe_dump(kubeconfig), encoding="utf-8")
        cfg.kubeconfig(user).chmod(0o600)
    cfg.tokens.clear()
    cfg.tokens.update(tokens)
    return tokens


def ensure_kueue_metrics_certs(certs: Path = KUEUE_METRICS_CERTS) -> None:
    """Kueue reads its metrics certificate from a fixed path; a self-signed pair there is enough here."""
    if (certs / "tls.crt").is_file() and (certs / "tls.key").is_file():
        return
    try:
        tmp = certs.parent / f".certs-{os.getpid()}"
        _self_signed(tmp / "tls.crt", tmp / "tls.key")
        with contextlib.suppress(OSError):
            tmp.rename(certs)
        shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        raise ConfigError(
            f"the Kueue controller reads its metrics certificate from {certs}/tls.{{crt,key}}, which this user "
            f"cannot write ({exc}); create a self-signed pair there once (e.g. with openssl, as root)"
        ) from exc


def write_kueue_config(cfg: ClusterConfig) -> Path:
    webhook = cfg.state_dir / "pki" / "kueue-webhook"
    if not (webhook / "tls.crt").is_file():
        _self_signed(webhook / "tls.crt", webhook / "tls.key")
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{cfg.kueue_health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{cfg.kueue_metrics_port}"},
        "webhook": {"host": "127.0.0.1", "port": cfg.kueue_webhook_port, "certDir": str(webhook)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
    }
    path = cfg.state_dir / "kueue.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def kueue_conversion(cfg: ClusterConfig) -> dict[str, Any]:
    """The CRD conversion stanza: the API server calls Kueue's webhook on loopback, trusting its own pair."""
    cert = (cfg.state_dir / "pki" / "kueue-webhook" / "tls.crt").read_bytes()
    return {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": {
        "url": f"https://127.0.0.1:{cfg.kueue_webhook_port}/convert", "caBundle": base64.b64encode(cert).decode()}}}


# ---------------------------------------------------------------------------------------------
# Command lines


def etcd_argv(cfg: ClusterConfig, bins: KubeBinaries) -> list[str]:
    peer = f"http://127.0.0.1:{cfg.etcd_peer_port}"
    return [
        str(bins.bin("etcd")), "--name", "default", "--data-dir", str(cfg.state_dir / "etcd"),
        "--listen-client-urls", cfg.etcd_url, "--advertise-client-urls", cfg.etcd_url,
        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", f"default={peer}",
        "--log-level", "warn", "--quota-backend-bytes", str(2 * 1024**3),
    ]  # fmt: skip


def apiserver_argv(cfg: ClusterConfig, bins: KubeBinaries) -> list[str]:
    pki = cfg.state_dir / "pki"
    return [
        str(bins.bin("kube-apiserver")), "--etcd-servers", cfg.etcd_url, "--bind-address", "127.0.0.1",
        "--secure-port", str(cfg.apiserver_port), "--cert-dir", str(pki / "apiserver"),
        "--advertise-address", "127.0.0.1", "--endpoint-reconciler-type", "none",
        "--service-cluster-ip-range", "10.0.0.0/24", "--service-account-issuer", "https://kubernetes.default.svc",
        "--service-account-key-file", str(pki / "sa.pub"), "--service-account-signing-key-file", str(pki / "sa.key"),
        "--token-auth-file", str(cfg.state_dir / "tokens.csv"), "--authorization-mode", "RBAC",
        "--enable-priority-and-fairness=false", "-v", "1",
        # Pods are watched from etcd itself (no watch cache): an etcd compaction reaches a pod watch that
        # resumes from an older resourceVersion as 410 Gone, as on a busy server whose cache rolled over.
        "--watch-cache-sizes", "pods#0",
    ]  # fmt: skip


def kueue_argv(cfg: ClusterConfig, bins: KubeBinaries) -> list[str]:
    return [str(bins.bin("kueue")), "--config", str(cfg.state_dir / "kueue.yaml"),
            "--feature-gates=VisibilityOnDemand=false", "--zap-log-level=info"]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Readiness


def _wait(what: str, probe: Callable[[], bool], alive: Callable[[], bool], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
            raise ServiceError(f"{what} exited before it was ready; see {log}:\n{tail}")
        with contextlib.suppress(httpx.HTTPError, OSError):
            if probe():
                return
        time.sleep(0.2)
    raise ServiceError(f"{what} not ready after {timeout:g}s; see {log}")


def _get_ok(url: str, token: str | None = None) -> bool:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(url, headers=headers, verify=False, timeout=2.0).status_code == 200  # noqa: S501 (loopback, self-signed)


# ---------------------------------------------------------------------------------------------
# The cluster


class LocalKube(recorded.Harness):
    """etcd, kube-apiserver and Kueue as child processes: `with LocalKube(cfg, bins) as kube: ...`.

    `owned=True` (tests): the processes die with this Python process, even when it is killed.
    `owned=False` (`gpuledger dev kube up`): they outlive it; `pids.json` lets `down` stop them."""

    def __init__(self, cfg: ClusterConfig, bins: KubeBinaries, *, owned: bool = True,
                 progress: Progress = _quiet) -> None:  # fmt: skip
        self.cfg, self.bins, self.owned, self.progress = cfg, bins, owned, progress
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, IO[bytes]] = {}
        self.start_s: float | None = None

    # -- processes

    def start_etcd(self, timeout: float = 60) -> None:
        proc = self._spawn("etcd", etcd_argv(self.cfg, self.bins))
        _wait("etcd", lambda: _get_ok(f"{self.cfg.etcd_url}/health"), lambda: proc.poll() is None,
              self.cfg.log("etcd"), timeout)  # fmt: skip

    def start_apiserver(self, timeout: float = 120) -> None:
        proc = self._spawn("kube-apiserver", apiserver_argv(self.cfg, self.bins))
        token = self.cfg.tokens[ADMIN]
        _wait("kube-apiserver", lambda: _get_ok(f"{self.cfg.server}/readyz", token), lambda: proc.poll() is None,
              self.cfg.log("kube-apiserver"), timeout)  # fmt: skip

    def start_kueue(self, timeout: float = 120) -> None:
        env = dict(os.environ, KUBECONFIG=str(self.cfg.kubeconfig(ADMIN)))
        proc = self._spawn("kueue", kueue_argv(self.cfg, self.bins), env)
        url = f"http://127.0.0.1:{self.cfg.kueue_health_port}/readyz"
        _wait("kueue", lambda: _get_ok(url), lambda: proc.poll() is None, self.cfg.log("kueue"), timeout)

    def restart_kueue(self) -> None:
        """Stop the Kueue controller and start it again: it reads its Configuration (`kueue.yaml`) only at start."""
        self._stop_one("kueue")
        self.start_kueue()

    @property
    def kueue_config(self) -> Path:
        """The Kueue controller's Configuration file (what `policy apply --engine kueue --kueue-config` writes)."""
        return self.cfg.state_dir / "kueue.yaml"

    def restart_apiserver(self) -> None:
        """Stop the API server and start it again on the same port and data (watches break), then the Kueue
        controller: its informers' list-and-watch fails while the server is down, and client-go backs off
        (0.8 s doubling to 30 s), so Kueue would see new objects up to a minute late (three restarts in a row:
        a Job's Workload after 1.6 s, 10.7 s, then 37 s); a controller started now watches at once."""
        self._stop_one("kube-apiserver")
        self.start_apiserver()
        if "kueue" in self.procs:
            self.restart_kueue()

    def _prepare(self) -> None:
        cfg = self.cfg
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        _service_account_keys(cfg.state_dir / "pki")
        write_tokens(cfg)
        write_kueue_config(cfg)
        ensure_kueue_metrics_certs()

    def _start_processes(self) -> None:
        cfg = self.cfg
        self.progress(f"etcd on {cfg.etcd_url}")
        self.start_etcd()
        self.progress(f"kube-apiserver on {cfg.server}")
        self.start_apiserver()
        self.progress("CRDs: Kueue (from its module), JobSet and Volcano (tests/fixtures/kubernetes/crds)")
        self.install_crds()
        self.kubectl("create", "namespace", "kueue-system", check=False)
        self.progress(f"kueue (webhook 127.0.0.1:{cfg.kueue_webhook_port}, not registered)")
        self.start_kueue()

    def stop(self) -> None:
        for name in reversed(PROCESSES):
            self._stop_one(name)
        recorded.forget(self.cfg.state_dir)

    # -- clients

    def kubectl(self, *args: str, user: str = ADMIN, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """Run kubectl as `user`; with `check`, a non-zero exit raises with its stderr."""
        argv = [str(self.bins.bin("kubectl")), "--kubeconfig", str(self.cfg.kubeconfig(user)), *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise ServiceError(f"kubectl {' '.join(args)} (as {user}) exited {proc.returncode}: {proc.stderr}")
        return proc

    def apply(self, manifest: str | list[dict[str, Any]], *, user: str = ADMIN,
              check: bool = True) -> subprocess.CompletedProcess[str]:  # fmt: skip
        text = manifest if isinstance(manifest, str) else yaml.safe_dump_all(manifest)
        return self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", user=user, input=text,
                            check=check)  # fmt: skip

    def install_crds(self) -> None:
        """Every CRD, server-side; Kueue's multi-version ones with its conversion webhook, as a real install
        has it (without it, a v1beta1 read or write of a v1beta2 object is not converted)."""
        from stack.kube import crd_files

        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # 10x faster on the 1.4 MB Workload CRD
        docs = []
        for path in crd_files(self.bins):
            crd = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 (a safe loader)
            if crd["spec"]["group"] == "kueue.x-k8s.io" and crd["spec"]["names"]["plural"] in KUEUE_CONVERTED:
                crd["spec"]["conversion"] = kueue_conversion(self.cfg)
            docs.append(crd)
        as_list = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
        self.kubectl("apply", "--server-side", "-f", "-", input=as_list, timeout=180)
        deadline = time.monotonic() + 90
        while True:  # `kubectl wait` fails at once on a CRD that has no conditions yet: ask again
            waited = self.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s", check=False)
            if waited.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise ServiceError(f"the CRDs were not Established within 90 s: {waited.stderr.strip()}")
            time.sleep(0.5)

    def etcd_compact(self) -> int:
        """Compact etcd at its current revision (through its JSON gateway): watches older than this get
        410 Gone. Returns the revision."""
        key = base64.b64encode(b"/registry").decode()
        header = httpx.post(f"{self.cfg.etcd_url}/v3/kv/range", json={"key": key, "limit": 1}, timeout=5).json()
        revision = int(header["header"]["revision"])
        httpx.post(f"{self.cfg.etcd_url}/v3/kv/compaction", json={"revision": revision, "physical": True},
                   timeout=30).raise_for_status()  # fmt: skip
        return revision


def eventually(probe: Callable[[], Any], what: str, timeout: float = 120,
               explain: Callable[[], str] | None = None) -> Any:  # fmt: skip
    """probe()'s first truthy value within `timeout` s (Kueue reacts in ~1 s idle, much later on a loaded CI);
    past it, TimeoutError naming `what`, with explain()'s account of the state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.25)
    raise TimeoutError(f"not within {timeout:g} s: {what}" + (f"\n{explain()}" if explain else ""))


def workload_of(kube: LocalKube, ns: str, job: str) -> dict[str, Any]:
    """The Kueue Workload a Job owns, {} before Kueue made it."""
    items = json.loads(kube.kubectl("-n", ns, "get", "workloads.kueue.x-k8s.io", "-o", "json").stdout)["items"]
    mine = [w for w in items if any(o.get("name") == job for o in w["metadata"].get("ownerReferences", []))]
    return mine[0] if mine else {}


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    """An object's status condition of type `ctype`, {} when it has none."""
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == ctype), {})


def stop_recorded(state_dir: Path) -> list[str]:
    """`gpuledger dev kube down`: stop the processes `up` recorded."""
    return recorded.stop_recorded(state_dir, PROCESSES)
