"""The binaries of the local Kubernetes control plane, built from pinned Go modules (no Docker, no kind).

etcd, kube-apiserver, kubectl and the Kueue controller are built with the machine's `go` into
`<user cache dir>/gpuledger/kube-<versions>/bin` once; a later run finds `.complete` there and only
starts them. Kueue's CRDs are copied from its own module zip into the same directory.

- kube-apiserver and kubectl: `k8s.io/kubernetes` cannot be `go install`ed (its go.mod replaces the
  staging modules with folders its zip does not hold), so a wrapper module pins each staging module to
  the matching `v0.<minor>.<patch>` and the binaries are stamped with the version (Kueue refuses a
  server whose version does not parse).
- etcd: `go.etcd.io/etcd/server/v3` replaces its sibling modules with folders too; the wrapper pins
  them to the same version.
- Kueue: `go install sigs.k8s.io/kueue/cmd/kueue@<version>` (its go.mod has no replace).

The build runs at low priority (`nice -n 19`, `GOMAXPROCS` and `-p` from `jobs`) so that it does not
starve what else the machine runs; about 8 minutes cold on 2 cores (docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from platformdirs import user_cache_dir

from base.errors import DependencyMissing, ServiceError

Progress = Callable[[str], None]

GO_MISSING = (
    "the local Kubernetes control plane is built from Go modules and needs Go >= 1.26 on PATH: "
    "install it (https://go.dev/dl/, or `apt-get install golang-go` where Debian's is new enough)"
)

# The staging modules of k8s.io/kubernetes, each pinned to v0.<minor>.<patch> in the wrapper module.
STAGING = (
    "api", "apiextensions-apiserver", "apimachinery", "apiserver", "cli-runtime", "client-go",
    "cloud-provider", "cluster-bootstrap", "code-generator", "component-base", "component-helpers",
    "controller-manager", "cri-api", "cri-client", "csi-translation-lib", "dynamic-resource-allocation",
    "endpointslice", "externaljwt", "kms", "kube-aggregator", "kube-controller-manager", "kube-proxy",
    "kube-scheduler", "kubectl", "kubelet", "metrics", "mount-utils", "pod-security-admission",
    "sample-apiserver", "sample-cli-plugin", "sample-controller",
)
ETCD_SIBLINGS = ("api/v3", "client/pkg/v3", "client/v3", "pkg/v3")
BINARIES = ("etcd", "kube-apiserver", "kubectl", "kueue")
MIN_GO = (1, 26)  # k8s.io/kubernetes v1.37's go.mod


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class KubeVersions:
    kubernetes: str = "1.37.2"
    etcd: str = "3.6.16"
    kueue: str = "0.17.0"

    @property
    def tag(self) -> str:
        return f"kube-k{self.kubernetes}-e{self.etcd}-q{self.kueue}"

    @property
    def staging(self) -> str:
        """The version of the staging modules (k8s.io/api ...) that ship with this Kubernetes."""
        return "v0." + self.kubernetes.split(".", 1)[1]


@dataclass(frozen=True)
class KubeBinaries:
    root: Path  # <cache>/kube-<versions>
    build_s: float | None  # seconds this process spent building; None: found in the cache

    def bin(self, name: str) -> Path:
        return self.root / "bin" / name

    @property
    def kueue_crds(self) -> Path:
        return self.root / "crds" / "kueue"


def cache_dir(versions: KubeVersions, cache_root: Path | None = None) -> Path:
    root = cache_root if cache_root is not None else Path(user_cache_dir("gpuledger"))
    return root / versions.tag


def find_go() -> str:
    """The `go` on PATH, when it is new enough for the pinned modules; else one line saying what to install."""
    go = shutil.which("go")
    if go is None:
        raise DependencyMissing(GO_MISSING)
    proc = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False, timeout=60)
    found = proc.stdout.strip().removeprefix("go")
    try:
        major, minor = (int(part) for part in found.split(".")[:2])
    except ValueError:
        raise DependencyMissing(f"{GO_MISSING} (`go env GOVERSION` said {found!r})") from None
    if (major, minor) < MIN_GO:
        raise DependencyMissing(f"{GO_MISSING} (found go{found})")
    return go


def is_built(root: Path) -> bool:
    return (root / ".complete").is_file() and all((root / "bin" / name).is_file() for name in BINARIES)


def _ldflags(version: str) -> str:
    major, minor = version.split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {pkg}.gitVersion=v{version}", f"-X {pkg}.gitMajor={major}", f"-X {pkg}.gitMinor={minor}"]
    return "-s -w " + " ".join(flags)


class _Go:
    """`go` at low priority with a bounded number of parallel jobs; a failure names the step."""

    def __init__(self, go: str, jobs: int, progress: Progress) -> None:
        self.go, self.jobs, self.progress = go, jobs, progress

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(GOMAXPROCS=str(self.jobs), GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-buildvcs=false")
        return env

    def __call__(self, cwd: Path, *args: str) -> None:
        argv = ["nice", "-n", "19", self.go, *args]
        if args[0] in ("build", "install"):
            argv[5:5] = ["-p", str(self.jobs)]
        self.progress(f"[{cwd.name}] go {' '.join(args)}")
        proc = subprocess.run(argv, cwd=cwd, env=self.env(), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ServiceError(f"`go {' '.join(args)}` in {cwd} exited {proc.returncode}:\n{proc.stderr[-3000:]}")


def _wrapper(src: Path, name: str, requires: dict[str, str], replaces: dict[str, str]) -> Path:
    mod = src / name
    mod.mkdir(parents=True, exist_ok=True)
    lines = [f"module gpuledger.local/{name}", "", "go 1.26", ""]
    lines += [f"require {path} {version}" for path, version in requires.items()]
    lines += [f"replace {path} => {path} {version}" for path, version in replaces.items()]
    (mod / "go.mod").write_text("\n".join(lines) + "\n", encoding="utf-8")
    imports = "\n".join(f'\t_ "{path}"' for path in requires)
    (mod / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n", encoding="utf-8")
    return mod


def _build_kubernetes(go: _Go, src: Path, bin_dir: Path, v: KubeVersions) -> None:
    replaces = {f"k8s.io/{name}": v.staging for name in STAGING}
    mod = _wrapper(src, "kubernetes", {"k8s.io/kubernetes": f"v{v.kubernetes}"}, replaces)
    (mod / "tools.go").write_text(
        '//go:build tools\n\npackage tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n'
        '\t_ "k8s.io/kubernetes/cmd/kubectl"\n)\n',
        encoding="utf-8",
    )
    go(mod, "mod", "tidy", "-e")
    for cmd in ("kube-apiserver", "kubectl"):
        go(mod, "build", "-trimpath", "-ldflags", _ldflags(v.kubernetes), "-o", str(bin_dir / cmd),
           f"k8s.io/kubernetes/cmd/{cmd}")


def _build_etcd(go: _Go, src: Path, bin_dir: Path, v: KubeVersions) -> None:
    replaces = {f"go.etcd.io/etcd/{name}": f"v{v.etcd}" for name in ETCD_SIBLINGS}
    mod = _wrapper(src, "etcd", {"go.etcd.io/etcd/server/v3": f"v{v.etcd}"}, replaces)
    go(mod, "mod", "tidy", "-e")
    go(mod, "build", "-trimpath", "-ldflags", "-s -w", "-o", str(bin_dir / "etcd"), "go.etcd.io/etcd/server/v3")


def _build_kueue(go: _Go, bin_dir: Path, crd_dir: Path, v: KubeVersions) -> None:
    gobin = bin_dir.parent / ".gobin"
    argv_env = go.env()
    argv_env["GOBIN"] = str(gobin)
    argv = ["nice", "-n", "19", go.go, "install", "-p", str(go.jobs), "-trimpath", "-ldflags", "-s -w",
            f"sigs.k8s.io/kueue/cmd/kueue@v{v.kueue}"]
    go.progress(f"go install sigs.k8s.io/kueue/cmd/kueue@v{v.kueue}")
    proc = subprocess.run(argv, cwd=bin_dir, env=argv_env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ServiceError(f"building kueue v{v.kueue} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    shutil.move(str(gobin / "kueue"), bin_dir / "kueue")
    shutil.rmtree(gobin, ignore_errors=True)
    mod_dir = _module_dir(go, f"sigs.k8s.io/kueue@v{v.kueue}")
    crd_dir.mkdir(parents=True, exist_ok=True)
    for crd in sorted((mod_dir / "config" / "components" / "crd" / "bases").glob("*.yaml")):
        shutil.copyfile(crd, crd_dir / crd.name)


def _module_dir(go: _Go, module: str) -> Path:
    proc = subprocess.run([go.go, "mod", "download", "-json", module], env=go.env(), capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise ServiceError(f"`go mod download {module}` exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    import json

    return Path(json.loads(proc.stdout)["Dir"])


def ensure_binaries(
    versions: KubeVersions | None = None,
    *,
    cache_root: Path | None = None,
    jobs: int = 1,
    rebuild: bool = False,
    progress: Progress = _quiet,
) -> KubeBinaries:
    """The four binaries and Kueue's CRDs for `versions`: from the cache, or built now."""
    v = versions or KubeVersions()
    root = cache_dir(v, cache_root)
    if rebuild:
        shutil.rmtree(root, ignore_errors=True)
    if is_built(root):
        return KubeBinaries(root, None)
    go = find_go()  # before the lock: without Go, nothing is written to the cache
    with _build_lock(root, progress):
        if is_built(root):  # another process built it while this one waited
            return KubeBinaries(root, None)
        return _build(v, root, _Go(go, max(1, jobs), progress))


CONTROLLER_MANAGER = "kube-controller-manager"


def ensure_controller_manager(bins: KubeBinaries, *, jobs: int = 1, progress: Progress = _quiet) -> Path:
    """kube-controller-manager of the same Kubernetes version, beside the other binaries: built on first use only
    (tests that need a real controller, e.g. the Job controller creating pods, ask for it; the control plane
    itself runs without one). About 3 minutes on 2 cores after kube-apiserver (the Go build cache is shared)."""
    target = bins.bin(CONTROLLER_MANAGER)
    if target.is_file():
        return target
    go = find_go()
    v = KubeVersions(kubernetes=bins.root.name.split("-k", 1)[1].split("-e", 1)[0])
    with _build_lock(_beside(bins.root, f".{CONTROLLER_MANAGER}"), progress):
        if target.is_file():
            return target
        src = bins.root / f"src-{CONTROLLER_MANAGER}"
        runner = _Go(go, max(1, jobs), progress)
        replaces = {f"k8s.io/{name}": v.staging for name in STAGING}
        mod = _wrapper(src, "kubernetes", {"k8s.io/kubernetes": f"v{v.kubernetes}"}, replaces)
        (mod / "tools.go").write_text(
            f'//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/{CONTROLLER_MANAGER}"\n',
            encoding="utf-8",
        )
        runner(mod, "mod", "tidy", "-e")
        partial = target.with_name(f".{CONTROLLER_MANAGER}.partial")
        runner(mod, "build", "-trimpath", "-ldflags", _ldflags(v.kubernetes), "-o", str(partial),
               f"k8s.io/kubernetes/cmd/{CONTROLLER_MANAGER}")  # fmt: skip
        partial.rename(target)
        shutil.rmtree(src, ignore_errors=True)
    return target


KWOK = "kwok"
KWOK_VERSION = "0.8.0"  # sigs.k8s.io/kwok: the newest served here (built with client-go 0.36, talks to 1.37 fine)
# KWOK's own stages (kustomize/stage in its module): pods created, started, completed (a Job's pod, after the delay
# its annotation `pod-complete.stage.kwok.x-k8s.io/delay` names) and deleted as a kubelet would; nodes made Ready
# and kept so by heartbeats.
KWOK_STAGES = ("pod/general/pod-create.yaml", "pod/general/pod-init-container-running.yaml",
               "pod/general/pod-init-container-completed.yaml", "pod/general/pod-ready.yaml",
               "pod/general/pod-complete.yaml", "pod/general/pod-delete.yaml", "node/fast/node-initialize.yaml",
               "node/heartbeat/node-heartbeat.yaml")  # fmt: skip


def kwok_stages(bins: KubeBinaries) -> Path:
    """The stages file KWOK runs with (written by `ensure_kwok`)."""
    return bins.root / "kwok" / f"stages-{KWOK_VERSION}.yaml"


def ensure_kwok(bins: KubeBinaries, *, jobs: int = 1, progress: Progress = _quiet) -> Path:
    """KWOK (sigs.k8s.io/kwok, the Kubernetes project's kubelet stand-in) beside the other binaries, with its own
    stages copied from its module: built on first use only, like kube-controller-manager (about 2 minutes on
    2 cores; `go install`, its go.mod has no replace)."""
    target = bins.bin(KWOK)
    if target.is_file() and kwok_stages(bins).is_file():
        return target
    go = find_go()
    with _build_lock(_beside(bins.root, f".{KWOK}"), progress):
        if target.is_file() and kwok_stages(bins).is_file():
            return target
        runner = _Go(go, max(1, jobs), progress)
        if not target.is_file():
            gobin = bins.root / ".gobin-kwok"
            env = runner.env()
            env["GOBIN"] = str(gobin)
            argv = ["nice", "-n", "19", go, "install", "-p", str(runner.jobs), "-trimpath", "-ldflags", "-s -w",
                    f"sigs.k8s.io/kwok/cmd/kwok@v{KWOK_VERSION}"]  # fmt: skip
            progress(f"go install sigs.k8s.io/kwok/cmd/kwok@v{KWOK_VERSION}")
            proc = subprocess.run(argv, cwd=bins.root, env=env, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise ServiceError(f"building kwok v{KWOK_VERSION} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
            shutil.move(str(gobin / KWOK), target)
            shutil.rmtree(gobin, ignore_errors=True)
        stage_dir = _module_dir(runner, f"sigs.k8s.io/kwok@v{KWOK_VERSION}") / "kustomize" / "stage"
        texts = [(stage_dir / name).read_text(encoding="utf-8").strip() for name in KWOK_STAGES]
        kwok_stages(bins).parent.mkdir(parents=True, exist_ok=True)
        kwok_stages(bins).write_text("\n---\n".join(texts) + "\n", encoding="utf-8")
    return target


def build_log(versions: KubeVersions | None = None, cache_root: Path | None = None) -> Path:
    """Where a build started in the background (`dev kube build --detach`) writes its output."""
    return _beside(cache_dir(versions or KubeVersions(), cache_root), ".build.log")


def _beside(root: Path, suffix: str) -> Path:
    return root.parent / f"{root.name}{suffix}"


@contextlib.contextmanager
def _build_lock(root: Path, progress: Progress) -> Iterator[None]:
    """One build per cache entry at a time: a second caller (a test fixture while `make test` builds in the
    background) waits for the first, then finds the binaries built."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(_beside(root, ".lock"), "w", encoding="utf-8") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for the Kubernetes build already running (its log: {_beside(root, '.build.log')})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build(v: KubeVersions, root: Path, go: _Go) -> KubeBinaries:
    started = time.monotonic()
    src = root / "src"
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    if not (bin_dir / "etcd").is_file():
        _build_etcd(go, src, bin_dir, v)
    if not ((bin_dir / "kube-apiserver").is_file() and (bin_dir / "kubectl").is_file()):
        _build_kubernetes(go, src, bin_dir, v)
    if not (bin_dir / "kueue").is_file():
        _build_kueue(go, bin_dir, root / "crds" / "kueue", v)
    build_s = time.monotonic() - started
    (root / ".complete").write_text(f"{build_s:.0f}\n", encoding="utf-8")
    shutil.rmtree(src, ignore_errors=True)
    return KubeBinaries(root, build_s)
