"""A live one-node Slurm on loopback: munge, MariaDB, slurmdbd, slurmctld and slurmd (Debian's packages).

Everything lives in `state_dir`, with ports of its own, so it never meets a site's Slurm or another
instance: munge listens on its own socket with its own key (`AuthInfo=socket=...`), MariaDB on its own
port and socket, and every Slurm daemon and client reads `SLURM_CONF=<state_dir>/etc/slurm.conf`.

Layout of `state_dir`:
    etc/slurm.conf        the cluster (one node `NODE`, GPUs over plain files, `JobSubmitPlugins=lua`,
                          `PreemptType=preempt/qos`, accounting through slurmdbd with limits enforced)
    etc/gres.conf         the node's GPUs: `Name=gpu Type=<type> File=<state_dir>/dev/nvidia[i-j]`
    etc/job_submit.lua    read by slurmctld at start and at `scontrol reconfigure` (pass-through at first)
    etc/slurmdbd.conf     mode 0600, as slurmdbd demands
    etc/prolog, epilog    the hooks of deploy/slurm (spooling into `spool/`), when `hooks` is on
    dev/nvidia<i>         plain files that play the GPUs
    munge/ mysql/ ctld/ slurmd/ spool/   the daemons' state; logs/<process>.log their output
    pids.json             the processes of `gpuledger dev slurm up` (read by `down`)

Slurm's `SlurmctldHost` must be this machine's short host name (slurmctld refuses to run otherwise);
its address is 127.0.0.1. Runs as root (`SlurmUser=root`): slurmd starts jobs as their user.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from base.errors import DependencyMissing, ServiceError
from stack import recorded
from stack.broker import free_ports, stop_process

Progress = Callable[[str], None]

PROCESSES = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")
UNIX_PATH_MAX = 108  # sun_path, the terminating zero included
SOCKET_PATH_ROOM = 48  # "/slurmd/" + slurmstepd's "<node>_<job id>.<step id>" (ids up to 10 digits each)
PACKAGES = ("slurm-wlm", "slurmdbd", "munge", "mariadb-server", "slurm-client")
# The binaries each Debian package brings (what `ensure_installed` looks for).
BINARIES = {
    "munged": "munge", "mariadbd": "mariadb-server", "mariadb-install-db": "mariadb-server",
    "mariadb": "mariadb-server", "slurmdbd": "slurmdbd", "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm",
    "sbatch": "slurm-client", "squeue": "slurm-client", "sinfo": "slurm-client", "scontrol": "slurm-client",
    "sacct": "slurm-client", "sacctmgr": "slurm-client", "scancel": "slurm-client",
}  # fmt: skip
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
NODE = "gpu-node-1"
PARTITION = "gpu"
ACCOUNT = "research"
DB_USER = "slurm"
ACCEPT_ALL_LUA = """-- gpuledger test cluster: accept every job (a test writes its own, then `scontrol reconfigure`)
function slurm_job_submit(job_desc, part_list, submit_uid)
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end
"""
HOOK_WRAPPER = """#!/bin/sh
# gpuledger test cluster: deploy/slurm/{script} as a site installs it, spooling into this cluster's spool
export GPULEDGER_SPOOL="{spool}" GPULEDGER_HOOK="{hook}" GPULEDGER_PYTHON="{python}"
exec /bin/sh "{script_path}"
"""


def _quiet(_: str) -> None:
    return None


def find_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for folder in SBIN:
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def missing_packages() -> list[str]:
    """The Debian packages whose binaries are not on this machine."""
    return sorted({pkg for binary, pkg in BINARIES.items() if find_binary(binary) is None})


def ensure_installed(progress: Progress = _quiet, timeout_s: float = 900) -> None:
    """Install the missing Debian packages with apt-get when root; otherwise raise one line naming them."""
    missing = missing_packages()
    if not missing:
        return
    command = f"apt-get install -y {' '.join(PACKAGES)}"
    if os.geteuid() != 0 or find_binary("apt-get") is None:
        raise DependencyMissing(f"a live Slurm needs the Debian packages {', '.join(missing)}: run `{command}` as root")
    progress(f"installing {', '.join(missing)} with apt-get (about a minute)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *PACKAGES]):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
        if proc.returncode != 0 and argv[1] == "install":
            raise DependencyMissing(f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    still = missing_packages()
    if still:
        raise DependencyMissing(f"apt-get installed {', '.join(PACKAGES)} but {', '.join(still)} is still missing")


def sockets_dir(state_dir: Path) -> Path:
    """Where the daemons' Unix sockets live (munge's, MariaDB's, slurmd's spool with slurmstepd's
    `<node>_<job>.<step>` sockets): the state dir, unless its path leaves too little of the 108 bytes a socket path
    may have (a long --state-dir, a test's temporary folder: slurmd then fails every job launch with "Unix socket
    path ... is too long"), then a short folder of its own in the temporary directory."""
    if len(str(state_dir)) + SOCKET_PATH_ROOM < UNIX_PATH_MAX:
        return state_dir
    digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"gpuledger-slurm-{digest}"


def _remove_sockets_dir(state_dir: Path) -> None:
    if sockets_dir(state_dir) != state_dir:
        shutil.rmtree(sockets_dir(state_dir), ignore_errors=True)


@dataclass(frozen=True)
class SlurmConfig:
    state_dir: Path
    slurmctld_port: int
    slurmd_port: int
    slurmdbd_port: int
    mariadb_port: int
    cluster_name: str = "gpuledger"
    gpus: tuple[tuple[str, int], ...] = (("h100", 2), ("a100", 2))
    cpus: int = 16  # declared (SlurmdParameters=config_overrides): more jobs at once than the machine's cores
    hooks_dir: Path | None = None  # deploy/slurm: install its prolog/epilog (Prolog=, Epilog=)
    db_password: str = ""
    accounting: bool = True  # False: no MariaDB, no slurmdbd, AccountingStorageType=accounting_storage/none
    gpu_tres: bool = True  # False: AccountingStorageTRES without gres/gpu (Slurm's default: no GPU TRES anywhere)

    @classmethod
    def on_free_ports(cls, state_dir: Path, hooks_dir: Path | None = None, cluster_name: str = "gpuledger",
                      accounting: bool = True) -> SlurmConfig:  # fmt: skip
        ctld, slurmd, dbd, db = free_ports(4)
        return cls(state_dir.resolve(), ctld, slurmd, dbd, db, cluster_name=cluster_name, hooks_dir=hooks_dir,
                   db_password=secrets.token_hex(12), accounting=accounting)  # fmt: skip

    def path(self, *parts: str) -> Path:
        return self.state_dir.joinpath(*parts)

    @property
    def slurm_conf(self) -> Path:
        return self.path("etc", "slurm.conf")

    @property
    def job_submit_lua(self) -> Path:
        return self.path("etc", "job_submit.lua")

    @property
    def spool(self) -> Path:
        return self.path("spool")

    @property
    def sockets_dir(self) -> Path:
        return sockets_dir(self.state_dir)

    @property
    def slurmd_spool(self) -> Path:
        return self.sockets_dir / "slurmd"

    @property
    def mysql_socket(self) -> Path:
        return self.sockets_dir / "mysql.sock"

    @property
    def munge_socket(self) -> Path:
        return self.sockets_dir / "munge" / "munge.socket"

    def log(self, process: str) -> Path:
        return self.path("logs", f"{process}.log")

    @property
    def gres(self) -> str:
        return ",".join(f"gpu:{kind}:{n}" for kind, n in self.gpus)

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client (sbatch, squeue, sacct, ...) needs in its environment to talk to this cluster."""
        return {"SLURM_CONF": str(self.slurm_conf)}

    def to_json(self) -> dict[str, Any]:
        return {
            "state_dir": str(self.state_dir), "slurmctld_port": self.slurmctld_port, "slurmd_port": self.slurmd_port,
            "slurmdbd_port": self.slurmdbd_port, "mariadb_port": self.mariadb_port, "cluster_name": self.cluster_name,
            "gpus": [list(g) for g in self.gpus], "cpus": self.cpus,
            "hooks_dir": str(self.hooks_dir) if self.hooks_dir else None, "accounting": self.accounting,
        }  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Files


def slurm_conf_text(cfg: SlurmConfig) -> str:
    host = socket.gethostname().split(".")[0]
    lines = [
        f"ClusterName={cfg.cluster_name}", f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={cfg.slurmctld_port}", f"SlurmdPort={cfg.slurmd_port}",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={cfg.munge_socket}",
        f"StateSaveLocation={cfg.path('ctld')}", f"SlurmdSpoolDir={cfg.slurmd_spool}",
        f"SlurmctldPidFile={cfg.path('ctld', 'slurmctld.pid')}", f"SlurmdPidFile={cfg.path('slurmd', 'slurmd.pid')}",
        f"SlurmctldLogFile={cfg.log('slurmctld')}", f"SlurmdLogFile={cfg.log('slurmd')}",
        "SlurmctldDebug=info", "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "GresTypes=gpu",
        "SlurmdParameters=config_overrides", "MpiDefault=none", "ReturnToService=2",
        "SchedulerType=sched/backfill", "SchedulerParameters=sched_interval=2,bf_interval=2",
        "JobSubmitPlugins=lua", "PreemptType=preempt/qos", "PreemptMode=REQUEUE",
        "MinJobAge=600", "KillWait=5", "InactiveLimit=0", "SlurmctldTimeout=30", "SlurmdTimeout=60",
        "MessageTimeout=20",
        # Fair share as a site runs it: the priority plugin is loaded only at slurmctld's start (a reconfigure
        # keeps the old one), so it is multifactor from the start; usage decays once per PriorityCalcPeriod
        # (minutes), so the shortest period lets a test see a decay pass within a minute.
        "PriorityType=priority/multifactor", "PriorityCalcPeriod=1",
    ]  # fmt: skip
    if cfg.accounting:
        lines += [
            "AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={cfg.slurmdbd_port}", "AccountingStorageEnforce=associations,limits,qos",
            f"AccountingStoragePass={cfg.munge_socket}",  # the munge socket for slurmdbd (AuthInfo is not used)
        ]  # fmt: skip
        if cfg.gpu_tres:
            lines.append("AccountingStorageTRES=" + ",".join(["gres/gpu", *(f"gres/gpu:{k}" for k, _ in cfg.gpus)]))
    else:
        lines.append("AccountingStorageType=accounting_storage/none")
    if cfg.hooks_dir is not None:
        lines += [f"Prolog={cfg.path('etc', 'prolog')}", f"Epilog={cfg.path('etc', 'epilog')}", "PrologFlags=Alloc"]
    lines += [
        f"NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cfg.cpus} Gres={cfg.gres} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def gres_conf_text(cfg: SlurmConfig) -> str:
    lines, first = ["AutoDetect=off"], 0
    for kind, n in cfg.gpus:
        files = f"nvidia{first}" if n == 1 else f"nvidia[{first}-{first + n - 1}]"
        lines.append(f"NodeName={NODE} Name=gpu Type={kind} File={cfg.path('dev', files)}")
        first += n
    return "\n".join(lines) + "\n"


def slurmdbd_conf_text(cfg: SlurmConfig) -> str:
    return "\n".join([
        "AuthType=auth/munge", f"AuthInfo=socket={cfg.munge_socket}", "DbdAddr=127.0.0.1", "DbdHost=localhost",
        f"DbdPort={cfg.slurmdbd_port}", "SlurmUser=root", "DebugLevel=info", f"LogFile={cfg.log('slurmdbd')}",
        f"PidFile={cfg.path('slurmdbd.pid')}", "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
        f"StoragePort={cfg.mariadb_port}", f"StorageUser={DB_USER}", f"StoragePass={cfg.db_password}",
        "StorageLoc=slurm_acct_db",
    ]) + "\n"  # fmt: skip


# Harmless character devices (null, zero, full, random, urandom): slurmd sets CUDA_VISIBLE_DEVICES and
# SLURM_JOB_GPUS only for GRES files that are devices; nothing opens them.
HARMLESS_DEVICES = ((1, 3), (1, 5), (1, 7), (1, 8), (1, 9))


def fake_gpu(path: Path, index: int) -> None:
    """A file that plays GPU `index`: a character device when this user may make one (root), else a plain
    file (Slurm then still allocates it by index but puts no device variables in the job's environment)."""
    if path.exists():
        return
    major, minor = HARMLESS_DEVICES[index % len(HARMLESS_DEVICES)]
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(major, minor))
    except OSError:
        path.touch()


def write_files(cfg: SlurmConfig) -> None:
    """Every configuration file and directory the daemons need (the job_submit.lua only when absent)."""
    for folder in ("etc", "dev", "munge", "mysql", "ctld", "slurmd", "spool", "logs"):
        cfg.path(folder).mkdir(parents=True, exist_ok=True)
    for socket_folder in (cfg.slurmd_spool, cfg.munge_socket.parent):
        socket_folder.mkdir(parents=True, exist_ok=True)
    for i in range(sum(n for _, n in cfg.gpus)):
        fake_gpu(cfg.path("dev", f"nvidia{i}"), i)
    cfg.slurm_conf.write_text(slurm_conf_text(cfg), encoding="utf-8")
    cfg.path("etc", "gres.conf").write_text(gres_conf_text(cfg), encoding="utf-8")
    dbd = cfg.path("etc", "slurmdbd.conf")
    dbd.write_text(slurmdbd_conf_text(cfg), encoding="utf-8")
    dbd.chmod(0o600)
    if not cfg.job_submit_lua.is_file():
        cfg.job_submit_lua.write_text(ACCEPT_ALL_LUA, encoding="utf-8")
    key = cfg.path("munge", "munge.key")
    if not key.is_file():
        key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o600)
    cfg.path("munge").chmod(0o700)
    if cfg.hooks_dir is not None:
        python = find_binary("python3") or "/usr/bin/python3"
        for name in ("prolog", "epilog"):
            script = cfg.path("etc", name)
            script.write_text(HOOK_WRAPPER.format(
                script=f"{name}.sh", spool=cfg.spool, hook=cfg.hooks_dir / "gpuledger_hook.py", python=python,
                script_path=cfg.hooks_dir / f"{name}.sh"), encoding="utf-8")  # fmt: skip
            script.chmod(0o755)


# ---------------------------------------------------------------------------------------------
# Command lines


def munged_argv(cfg: SlurmConfig) -> list[str]:
    m = cfg.path("munge")
    return [find_binary("munged") or "munged", "-F", "--force", f"--socket={cfg.munge_socket}",
            f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}", f"--seed-file={m / 'munged.seed'}",
            f"--log-file={cfg.log('munged-own')}", "--num-threads=2"]  # fmt: skip


def mariadbd_argv(cfg: SlurmConfig) -> list[str]:
    return [find_binary("mariadbd") or "mariadbd", "--no-defaults", f"--datadir={cfg.path('mysql')}",
            "--bind-address=127.0.0.1", f"--port={cfg.mariadb_port}", f"--socket={cfg.mysql_socket}",
            f"--pid-file={cfg.path('mariadbd.pid')}", "--user=root", "--skip-name-resolve",
            "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=16M", "--skip-log-bin",
            "--innodb-flush-log-at-trx-commit=0"]  # fmt: skip


def daemon_argv(cfg: SlurmConfig, name: str) -> list[str]:
    binary = find_binary(name) or name
    if name == "slurmdbd":
        return [binary, "-D"]
    if name == "slurmctld":
        return [binary, "-D", "-i", "-f", str(cfg.slurm_conf)]
    return [binary, "-D", "-N", NODE, "-f", str(cfg.slurm_conf)]


# ---------------------------------------------------------------------------------------------
# Waiting with the log's tail in the error


def log_tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.is_file() else f"({path} is empty)"


def wait_until(what: str, probe: Callable[[], bool], *, alive: Callable[[], bool], logs: Sequence[Path],
               timeout: float, every: float = 0.2) -> None:  # fmt: skip
    """Until `probe()` is true; a process that exited, or the timeout, raises with the logs' tails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            tails = "\n".join(f"--- {p}:\n{log_tail(p)}" for p in logs)
            raise ServiceError(f"{what} exited before it was ready:\n{tails}")
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if probe():
                return
        time.sleep(every)
    tails = "\n".join(f"--- {p}:\n{log_tail(p)}" for p in logs)
    raise ServiceError(f"{what} not ready after {timeout:g} s:\n{tails}")


def processes_of(conf: Path) -> list[int]:
    """Pids of the processes started for the cluster of `conf` that outlive its daemons: slurmstepd and
    the jobs' own processes carry `SLURM_CONF=<conf>` in their environment."""
    needle = f"SLURM_CONF={conf}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes() + b"\0":
                found.append(int(entry.name))
    return found


# ---------------------------------------------------------------------------------------------
# The cluster


class LocalSlurm(recorded.Harness):
    """The five daemons as child processes: `with LocalSlurm(cfg) as slurm: ...`.

    `owned=True` (tests): they die with this Python process, even when it is killed.
    `owned=False` (`gpuledger dev slurm up`): they outlive it; `pids.json` lets `down` stop them."""

    def __init__(self, cfg: SlurmConfig, *, owned: bool = True, progress: Progress = _quiet) -> None:
        self.cfg, self.owned, self.progress = cfg, owned, progress
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, IO[bytes]] = {}
        self.start_s: float | None = None
        self.client = SlurmClient(cfg)
        self.run = self.client.run

    def _spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        # slurmdbd reads slurmdbd.conf from SLURM_CONF's folder
        return super()._spawn(name, argv, self.client.env if env is None else env)

    def _alive(self, name: str) -> Callable[[], bool]:
        return lambda: self.procs[name].poll() is None

    def _ok(self, *argv: str) -> bool:
        return self.run(*argv, check=False, timeout=15).returncode == 0

    def start_munge(self) -> None:
        self._spawn("munged", munged_argv(self.cfg))
        wait_until("munged", self.cfg.munge_socket.exists, alive=self._alive("munged"),
                   logs=[self.cfg.log("munged"), self.cfg.log("munged-own")], timeout=30)  # fmt: skip

    def start_mariadb(self) -> None:
        datadir = self.cfg.path("mysql")
        if not (datadir / "mysql").is_dir():
            install = [find_binary("mariadb-install-db") or "mariadb-install-db", "--no-defaults",
                       f"--datadir={datadir}", "--user=root", "--skip-test-db",
                       "--auth-root-authentication-method=socket"]  # fmt: skip
            self.run(*install, timeout=180)
        self._spawn("mariadbd", mariadbd_argv(self.cfg))
        sql = self._sql
        wait_until("mariadbd", lambda: sql("SELECT 1", check=False).returncode == 0, alive=self._alive("mariadbd"),
                   logs=[self.cfg.log("mariadbd")], timeout=90)  # fmt: skip
        pw = self.cfg.db_password
        sql(f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{pw}'; "
            f"ALTER USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{pw}'; "
            f"GRANT ALL ON slurm_acct_db.* TO '{DB_USER}'@'127.0.0.1'; FLUSH PRIVILEGES;")  # fmt: skip

    def _sql(self, statement: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        mariadb = find_binary("mariadb") or "mariadb"
        return self.run(mariadb, "--no-defaults", f"--socket={self.cfg.mysql_socket}", "-u", "root",
                        "-e", statement, check=check, timeout=30)  # fmt: skip

    def start_slurmdbd(self) -> None:
        self._spawn("slurmdbd", daemon_argv(self.cfg, "slurmdbd"))
        wait_until("slurmdbd", lambda: self._ok("sacctmgr", "-n", "-P", "show", "cluster"),
                   alive=self._alive("slurmdbd"), logs=[self.cfg.log("slurmdbd")], timeout=90, every=0.5)  # fmt: skip

    def seed_accounting(self) -> None:
        """The cluster, an account with root in it (associations are enforced), QOS `prod` over `scavenger`."""
        name = self.cfg.cluster_name
        if name not in self.run("sacctmgr", "-n", "-P", "show", "cluster", "format=cluster").stdout.split():
            self.run("sacctmgr", "-i", "add", "cluster", name)
        self.run("sacctmgr", "-i", "add", "account", ACCOUNT, f"cluster={name}", "description=tests",
                 "organization=gpuledger", check=False)  # fmt: skip
        self.run("sacctmgr", "-i", "add", "qos", "scavenger", "priority=0", check=False)
        self.run("sacctmgr", "-i", "add", "qos", "prod", "priority=1000", "preempt=scavenger", "preemptmode=requeue",
                 check=False)  # fmt: skip
        self.run("sacctmgr", "-i", "add", "user", "root", f"account={ACCOUNT}", f"cluster={name}",
                 "qos=normal,prod,scavenger", check=False)  # fmt: skip

    def start_slurmctld(self) -> None:
        self._spawn("slurmctld", daemon_argv(self.cfg, "slurmctld"))
        wait_until("slurmctld", lambda: self._ok("scontrol", "ping"), alive=self._alive("slurmctld"),
                   logs=[self.cfg.log("slurmctld")], timeout=60, every=0.3)  # fmt: skip

    def start_slurmd(self) -> None:
        self._spawn("slurmd", daemon_argv(self.cfg, "slurmd"))
        wait_until(f"slurmd ({NODE} idle)", self._node_ready, alive=self._alive("slurmd"),
                   logs=[self.cfg.log("slurmd"), self.cfg.log("slurmctld")], timeout=60, every=0.3)  # fmt: skip

    def _node_ready(self) -> bool:
        out = self.run("sinfo", "-h", "-n", NODE, "-o", "%t", check=False, timeout=15).stdout.strip()
        return out in ("idle", "mix", "alloc")

    def _prepare(self) -> None:
        write_files(self.cfg)

    def _start_processes(self) -> None:
        cfg = self.cfg
        self.progress(f"munged on {cfg.munge_socket}")
        self.start_munge()
        if cfg.accounting:
            self.progress(f"mariadbd on 127.0.0.1:{cfg.mariadb_port}")
            self.start_mariadb()
            self.progress(f"slurmdbd on 127.0.0.1:{cfg.slurmdbd_port}")
            self.start_slurmdbd()
            self.seed_accounting()
        self.progress(f"slurmctld on 127.0.0.1:{cfg.slurmctld_port}")
        self.start_slurmctld()
        self.progress(f"slurmd ({NODE}: {cfg.gres}) on 127.0.0.1:{cfg.slurmd_port}")
        self.start_slurmd()

    def stop(self) -> None:
        """Stop the daemons by pid (slurmd first), then whatever of its jobs outlived it (slurmstepd, tasks)."""
        for name in reversed(PROCESSES):
            self._stop_one(name)
        for pid in processes_of(self.cfg.slurm_conf):
            stop_process(pid, timeout=5, group=False)
        _remove_sockets_dir(self.cfg.state_dir)
        recorded.forget(self.cfg.state_dir)



def stop_recorded(state_dir: Path) -> list[str]:
    """`gpuledger dev slurm down`: stop the processes `up` recorded, then the jobs they left."""

    def jobs() -> None:
        for pid in processes_of(state_dir / "etc" / "slurm.conf"):
            stop_process(pid, timeout=5, group=False)
        _remove_sockets_dir(state_dir)

    return recorded.stop_recorded(state_dir, PROCESSES, after=jobs)


# ---------------------------------------------------------------------------------------------
# A client of the cluster (tests and developers)


@dataclass(frozen=True)
class Submission:
    """What `sbatch --parsable` answered: the job id, or its exit status and its own error output."""

    job_id: str | None
    returncode: int
    stdout: str
    stderr: str


FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE")  # fmt: skip


class SlurmClient:
    """Slurm's own commands against the cluster of `cfg` (SLURM_CONF in their environment)."""

    def __init__(self, cfg: SlurmConfig) -> None:
        self.cfg = cfg
        self.env = dict(os.environ, **cfg.env)

    def run(self, *argv: str, check: bool = True, timeout: float = 60, input: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """A client command against this cluster; with `check`, a non-zero exit raises with its stderr."""
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False, input=input,
                              env=env or self.env)  # fmt: skip
        if check and proc.returncode != 0:
            raise ServiceError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def sbatch(self, *args: str, wrap: str | None = "sleep 300", output: Path | None = None) -> Submission:
        """`sbatch --parsable ARGS [--wrap WRAP]`; output to `output` (default: the state dir's `jobs/`)."""
        out = output or self.cfg.path("jobs", "%j.out")
        out.parent.mkdir(parents=True, exist_ok=True)
        argv = ["sbatch", "--parsable", "-o", str(out), *args]
        if wrap is not None:
            argv += ["--wrap", wrap]
        proc = self.run(*argv, check=False)
        job_id = proc.stdout.strip().split(";")[0] if proc.returncode == 0 else None
        return Submission(job_id or None, proc.returncode, proc.stdout, proc.stderr)

    def submit(self, *args: str, wrap: str | None = "sleep 300") -> str:
        """`sbatch` that must be accepted: the job id (a rejection raises with sbatch's error)."""
        sub = self.sbatch(*args, wrap=wrap)
        if sub.job_id is None:
            raise ServiceError(f"sbatch {' '.join(args)} exited {sub.returncode}: {sub.stderr.strip()}")
        return sub.job_id

    def show_job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -d -o JOB` as key -> value (the first record; `JOB_GRES`, `GRES` included)."""
        proc = self.run("scontrol", "show", "job", "-d", "-o", job_id, check=False)
        fields: dict[str, str] = {}
        for token in proc.stdout.split():
            key, sep, value = token.partition("=")
            if sep and key not in fields:
                fields[key] = value
        return fields

    def state(self, job_id: str) -> str | None:
        """The job's state: slurmctld's while it remembers the job (MinJobAge), else accounting's."""
        state = self.show_job(job_id).get("JobState")
        if state:
            return state
        acct = self.run("sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State", check=False).stdout.split()
        return acct[0].split()[0] if acct else None

    def wait_for_state(self, job_id: str, *states: str, timeout: float = 60) -> str:
        """Until the job is in one of `states`; returns it. Timing out raises with the state seen and the log tail."""
        deadline = time.monotonic() + timeout
        seen: str | None = None
        while time.monotonic() < deadline:
            seen = self.state(job_id)
            if seen in states:
                return seen
            time.sleep(0.3)
        detail = self.show_job(job_id)
        raise ServiceError(
            f"job {job_id} not {'/'.join(states)} within {timeout:g} s (last {seen}, reason {detail.get('Reason')}); "
            f"slurmctld log:\n{log_tail(self.cfg.log('slurmctld'), 1500)}"
        )

    def gres_indices(self, job_id: str) -> dict[str, tuple[int, ...]]:
        """Node -> GPU indices, from `scontrol show job -d` (`GRES=gpu:h100:2(IDX:0-1)`)."""
        out = self.run("scontrol", "show", "job", "-d", job_id).stdout
        found: dict[str, tuple[int, ...]] = {}
        for line in out.splitlines():
            words = dict(w.partition("=")[::2] for w in line.split() if "=" in w)
            if "Nodes" in words and "GRES" in words:
                indices: list[int] = []
                for part in words["GRES"].split("IDX:")[1:]:
                    for rng in part.split(")")[0].split(","):
                        lo, _, hi = rng.partition("-")
                        indices.extend(range(int(lo), int(hi or lo) + 1))
                found[words["Nodes"]] = tuple(indices)
        return found

    def reconfigure(self, lua: str | None = None) -> None:
        """Write a new job_submit.lua (when given) and have slurmctld read its configuration again.

        job_submit/lua reloads its script at the next submission when the file's mtime (whole seconds) is
        later than the one it loaded: a script written within the same second would be ignored, so the new
        mtime is at least one second after the old one."""
        if lua is not None:
            path = self.cfg.job_submit_lua
            before = int(path.stat().st_mtime) if path.is_file() else 0
            path.write_text(lua, encoding="utf-8")
            mtime = max(int(time.time()), before + 1)
            os.utime(path, (mtime, mtime))
        self.run("scontrol", "reconfigure")
        wait_until("slurmctld after reconfigure", lambda: self.run("scontrol", "ping", check=False).returncode == 0,
                   alive=lambda: True, logs=[self.cfg.log("slurmctld")], timeout=30)  # fmt: skip

    def cancel_all(self, timeout: float = 60) -> None:
        """Cancel every job and wait until none holds the node (tests start from an idle cluster)."""
        self.run("scancel", "--user=root", "--full", check=False)

        def drained() -> bool:
            return self.run("squeue", "-h", "-o", "%i", check=False).stdout.strip() == ""

        wait_until("every job gone", drained, alive=lambda: True, logs=[self.cfg.log("slurmctld")], timeout=timeout)
