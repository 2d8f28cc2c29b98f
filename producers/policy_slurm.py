"""The policy on Slurm: the desired accounting state (QOS, accounts, associations), the `sacctmgr`
commands that create it, a `slurm.conf` fragment, and the drift between it and what `sacctmgr show -P`
says is live.

Pure: a `Policy` in, plain data and text out; the live side comes in as `sacctmgr -P` text. Running
`sacctmgr` is the CLI's job (producers/policy_cli.py).

How the policy maps onto Slurm:
- a tier is a QOS: `Priority`, `Preempt=<lower tiers it preempts>`, `PreemptMode=requeue` (a preempted
  job goes back to the queue; `suspend` would not free the GPUs); the interactive tier's QOS carries
  `MaxTRESPerUser=gres/gpu=N` and `MaxWall`;
- a team is an account whose association carries `GrpTRES=gres/gpu:<type>=quota+borrowing` per
  generation (Slurm has no guaranteed-versus-borrowed split: the association's cap is what the team may
  hold in all; the guarantee is kept by the higher tiers preempting the preemptible one), `Fairshare`
  (the team's shares), its tiers as the allowed QOS, the highest as the default; each member is a user
  association under it;
- lending limits have no Slurm equivalent (a cap on others, not on the lender) and are not rendered;
- fair share: `PriorityType=priority/multifactor` with the policy's weights, `PriorityDecayHalfLife` (or
  0 and no usage reset when usage accumulates), `PreemptType=preempt/qos`, `PreemptMode=REQUEUE`.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal

from base.errors import ParseError
from schemas.policy import Policy

QOS_FIELDS = ("Name", "Priority", "Preempt", "PreemptMode", "MaxTRESPU", "MaxWall")
ASSOC_FIELDS = ("Account", "User", "ParentName", "GrpTRES", "Fairshare", "QOS", "DefaultQOS")
MAX_SHOW_LINES = 100_000


@dataclass(frozen=True)
class Qos:
    name: str
    priority: int
    preempt: frozenset[str] = frozenset()
    preempt_mode: str = "requeue"
    max_tres_per_user: str = ""
    max_wall: str = ""

    def settings(self) -> dict[str, str]:
        return {
            "Priority": str(self.priority),
            "Preempt": ",".join(sorted(self.preempt)),
            "PreemptMode": self.preempt_mode,
            "MaxTRESPerUser": self.max_tres_per_user,
            "MaxWall": self.max_wall,
        }


@dataclass(frozen=True)
class Association:
    account: str
    user: str = ""  # empty: the account's own association
    grp_tres: Mapping[str, int] = field(default_factory=dict)  # "gres/gpu:h100" -> GPUs
    fairshare: int = 1
    qos: frozenset[str] = frozenset()
    default_qos: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.account, self.user)

    def settings(self) -> dict[str, str]:
        out = {"QOS": ",".join(sorted(self.qos)), "DefaultQOS": self.default_qos}
        if not self.user:
            out["GrpTRES"] = tres_text(self.grp_tres)
            out["Fairshare"] = str(self.fairshare)
        return out


@dataclass(frozen=True)
class SlurmState:
    qos: dict[str, Qos]
    associations: dict[tuple[str, str], Association]


def tres_text(tres: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(tres.items()))


def _wall(hours: Decimal) -> str:
    """Slurm's `[days-]hours:minutes:seconds` for a number of hours (rounded down to the second)."""
    seconds = int(hours * 3600)
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def tier_qos(tier: str) -> str:
    """The QOS a tier is rendered as (its own name)."""
    return tier


def preemptible_qos(policy: Policy) -> frozenset[str]:
    """The QOS the policy renders for its preemptible tier (none without a `preemptible` section): what the
    Slurm producer prices as preemptible when a policy is configured."""
    return frozenset({tier_qos(policy.preemptible.tier)}) if policy.preemptible is not None else frozenset()


def desired_state(policy: Policy) -> SlurmState:
    qos: dict[str, Qos] = {}
    for tier in policy.tiers:
        interactive = policy.interactive if policy.interactive and policy.interactive.tier == tier.name else None
        qos[tier_qos(tier.name)] = Qos(
            name=tier_qos(tier.name),
            priority=tier.priority,
            preempt=frozenset(tier_qos(t) for t in tier.preempts),
            max_tres_per_user=f"gres/gpu={interactive.max_gpus_per_user}" if interactive else "",
            max_wall=_wall(interactive.max_session_hours) if interactive else "",
        )
    assocs: dict[tuple[str, str], Association] = {}
    for team in policy.teams:
        tiers = tuple(tier_qos(t) for t in policy.team_tiers(team))
        grp = {
            f"gres/gpu:{policy.generations[gen].slurm_gres}": team.quota.get(gen, 0) + team.borrowing_limit.get(gen, 0)
            for gen in policy.generations
        }
        base = Association(team.account, "", grp, team.shares, frozenset(tiers), tiers[0] if tiers else "")
        assocs[base.key] = base
        for user in team.members:
            member = Association(team.account, user, {}, 1, frozenset(tiers), tiers[0] if tiers else "")
            assocs[member.key] = member
    return SlurmState(qos, assocs)


# -- rendering ------------------------------------------------------------------------------------


def _assignments(values: Mapping[str, str]) -> list[str]:
    """`Key=value` words for the values set (a new object has nothing to clear)."""
    return [f"{key}={value}" for key, value in values.items() if value]


# What `policy apply` writes into the Description of each QOS and account it creates: Slurm keeps no record of who
# made what, so this mark is how `apply --prune` tells what the tool created from everyone else's (issue 41).
MARK = "gpuledger-policy"


def create_commands(state: SlurmState) -> list[list[str]]:
    """The sacctmgr argv (after `sacctmgr -i`) that create `state` on an empty cluster, in order; each QOS and account
    created carries `MARK` as its Description."""
    cmds: list[list[str]] = []
    for q in sorted(state.qos.values(), key=lambda q: q.priority):  # preempted QOS exist before their preemptors
        cmds.append(["add", "qos", q.name, f"Description={MARK}"])
        cmds.append(["modify", "qos", "where", f"name={q.name}", "set", *_assignments(q.settings())])
    for a in sorted(state.associations.values(), key=lambda a: (a.account, a.user)):
        s = a.settings()
        if not a.user:
            cmds.append(["add", "account", a.account, f"Fairshare={a.fairshare}", f"Description={MARK}"])
            cmds.append(["modify", "account", "where", f"name={a.account}", "set", *_assignments(s)])
        else:
            cmds.append(["add", "user", a.user, f"account={a.account}", f"QOS={s['QOS']}",
                         f"DefaultQOS={s['DefaultQOS']}"])  # fmt: skip
    return cmds


def render_script(state: SlurmState) -> str:
    lines = [
        "#!/bin/sh",
        "# Generated by `gpuledger policy render --engine slurm` from policy.yaml: review, then run once",
        "# on a cluster with accounting (or `gpuledger policy apply --engine slurm`, which also corrects drift).",
        "set -e",
    ]
    for argv in create_commands(state):
        lines.append(" ".join(["sacctmgr", "-i", *(shlex.quote(w) for w in argv)]))
    return "\n".join(lines) + "\n"


def half_life_text(half_life_days: Decimal) -> str:
    """Slurm's `days-hours:minutes` for a half-life in days, to the nearest minute (a policy below one minute is
    refused by the loader: `0-00:00` would mean no decay at all)."""
    minutes = int((half_life_days * 24 * 60).to_integral_value(rounding=ROUND_HALF_UP))
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}"


def conf_settings(policy: Policy) -> dict[str, str]:
    """The slurm.conf settings the policy's fair share decides, as written (`apply` writes them; `diff` compares
    them with what slurmctld runs). Usage is never reset by the calendar: under decay it halves every half-life,
    under accumulate it stays (PriorityDecayHalfLife=0)."""
    fs = policy.fair_share
    half_life = fs.half_life
    return {
        "PriorityType": "priority/multifactor",
        "PriorityWeightFairshare": str(fs.weight_fairshare),
        "PriorityWeightAge": str(fs.weight_age),
        "PriorityWeightQOS": str(fs.weight_qos),
        "PriorityWeightJobSize": str(fs.weight_job_size),
        "PriorityMaxAge": f"{fs.max_age_days}-0",
        "PriorityDecayHalfLife": "0" if half_life is None else half_life_text(half_life),
        "PriorityUsageResetPeriod": "NONE",
    }


def render_conf(policy: Policy) -> str:
    lines = ["# slurm.conf fragment generated by `gpuledger policy render --engine slurm` from policy.yaml."]
    settings = conf_settings(policy)
    if policy.fair_share.half_life is None:
        lines.append("# fair_share.mode accumulate: usage never decays and is never reset")
    lines += [f"{key}={value}" for key, value in settings.items()]
    lines += [
        "PreemptType=preempt/qos",
        "PreemptMode=REQUEUE",
        "AccountingStorageEnforce=associations,limits,qos",
        "AccountingStorageTRES=gres/gpu," + ",".join(f"gres/gpu:{g.slurm_gres}" for g in policy.generations.values()),
    ]
    return "\n".join(lines) + "\n"


# -- slurm.conf: the fair-share settings, written and compared with the running controller ------------
# `apply` writes conf_settings() into slurm.conf as one marked block (a setting of the same name elsewhere in the
# file is commented out, so the block is the one place it is said) and runs `scontrol reconfigure`. Multifactor
# re-reads its weights, half-life, max age and reset period at a reconfigure; the priority plugin itself is loaded
# once, at slurmctld's start (measured on 22.05.8: after a reconfigure `scontrol show config` names the new
# PriorityType while the old plugin still runs). So a PriorityType change is stamped in the block, and while
# slurmctld's BOOT_TIME is older than the stamp the setting is drift that names the restart it needs.

BLOCK_BEGIN = "# BEGIN gpuledger policy: fair share (`gpuledger policy apply --engine slurm`; edits here are drift)"
BLOCK_END = "# END gpuledger policy"
COMMENTED = "#gpuledger-policy: "  # the prefix a managed setting outside the block is commented out with
RESTART_STAMP = "# PriorityType set at "  # + epoch seconds: when the block changed the priority plugin
RESTART_KEYS = frozenset({"prioritytype"})
DURATION_KEYS = frozenset({"prioritydecayhalflife", "prioritymaxage"})
MAX_CONF_BYTES = 4 << 20
MAX_CONFIG_LINES = 5_000


def slurm_minutes(text: str) -> int | None:
    """Minutes of a Slurm duration as slurm.conf and `scontrol show config` write it (`M`, `M:S`, `H:M:S`,
    `D-H`, `D-H:M`, `D-H:M:S`), seconds rounded down; None when it is not one."""
    text = text.strip()
    days = 0
    if "-" in text:
        head, _, text = text.partition("-")
        if not head.isdigit():
            return None
        days = int(head)
        parts = text.split(":")
        if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
            return None
        hours, minutes = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
        return days * 1440 + hours * 60 + minutes
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    if len(parts) == 1:
        return int(parts[0])
    if len(parts) == 2:
        return int(parts[0])  # minutes:seconds
    return int(parts[0]) * 60 + int(parts[1])


def parse_show_config(text: str) -> dict[str, str]:
    """`scontrol show config` as lower-cased key -> value (`Key = value` lines; the header and blanks skipped)."""
    out: dict[str, str] = {}
    lines = text.splitlines()
    if len(lines) > MAX_CONFIG_LINES:
        raise ParseError(f"scontrol show config: more than {MAX_CONFIG_LINES} lines")
    for line in lines:
        key, sep, value = line.partition(" = ")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip().lower()] = value.strip()
    return out


def _same_setting(key: str, want: str, have: str | None) -> bool:
    if have is None:
        return False
    key = key.lower()
    if key in DURATION_KEYS:
        return slurm_minutes(want) == slurm_minutes(have)
    return want.strip().lower() == have.strip().lower()


def _boot_epoch(config: Mapping[str, str]) -> float | None:
    """slurmctld's start (BOOT_TIME, local time as Slurm prints it) as epoch seconds."""
    import time

    text = config.get("boot_time", "")
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


@dataclass(frozen=True)
class ConfDrift:
    setting: str
    want: str
    have: str | None
    restart: bool = False  # the file says it, the running slurmctld does not: it needs a restart

    def __str__(self) -> str:
        if self.restart:
            return (f"slurm.conf {self.setting}: slurmctld started before it was set to {self.want}; "
                    "`scontrol reconfigure` does not load another priority plugin: restart slurmctld")  # fmt: skip
        return f"slurm.conf {self.setting}: slurmctld runs {self.have or '(none)'}, policy says {self.want}"


def block_stamp(conf_text: str) -> float | None:
    """When the block last changed PriorityType (epoch seconds), or None."""
    inside = False
    for line in conf_text.splitlines():
        if line.strip() == BLOCK_BEGIN:
            inside = True
        elif line.strip() == BLOCK_END:
            inside = False
        elif inside and line.startswith(RESTART_STAMP):
            try:
                return float(line[len(RESTART_STAMP):].split()[0])
            except (ValueError, IndexError):
                return None
    return None


def conf_drift(policy: Policy, show_config: str, conf_text: str | None = None) -> list[ConfDrift]:
    """The fair-share settings slurmctld runs with (`scontrol show config`) against the policy's; with the
    slurm.conf text, a PriorityType written after slurmctld's start is drift too (it needs a restart)."""
    live = parse_show_config(show_config)
    out = []
    for key, want in conf_settings(policy).items():
        have = live.get(key.lower())
        if not _same_setting(key, want, have):
            out.append(ConfDrift(key, want, have))
    stamp = block_stamp(conf_text) if conf_text is not None else None
    boot = _boot_epoch(live)
    if stamp is not None and boot is not None and boot < stamp and not any(d.setting == "PriorityType" for d in out):
        out.append(ConfDrift("PriorityType", conf_settings(policy)["PriorityType"], live.get("prioritytype"),
                             restart=True))  # fmt: skip
    return out


def _setting_key(line: str) -> str | None:
    """The lower-cased key of a `Key=value` line (None for comments, blanks and other shapes)."""
    text = line.strip()
    if not text or text.startswith("#") or "=" not in text:
        return None
    return text.split("=", 1)[0].strip().lower()


def write_conf(conf_text: str, policy: Policy, now_s: float, running_priority_type: str | None) -> str:
    """slurm.conf with the policy's block (replacing an earlier one, at the end) and every other line that sets a
    managed key commented out. The PriorityType stamp is renewed when the plugin the controller runs is not the
    policy's (it needs a restart from now on), else kept."""
    if len(conf_text.encode()) > MAX_CONF_BYTES:
        raise ParseError(f"slurm.conf is larger than {MAX_CONF_BYTES} bytes")
    settings = conf_settings(policy)
    managed = {k.lower() for k in settings}
    old_stamp = block_stamp(conf_text)
    kept: list[str] = []
    inside = False
    for line in conf_text.splitlines():
        if line.strip() == BLOCK_BEGIN:
            inside = True
            continue
        if line.strip() == BLOCK_END:
            inside = False
            continue
        if inside:
            continue
        key = _setting_key(line)
        kept.append(f"{COMMENTED}{line}" if key in managed else line)
    while kept and not kept[-1].strip():
        kept.pop()
    want_type = settings["PriorityType"]
    changes_plugin = running_priority_type is None or running_priority_type.lower() != want_type
    stamp = now_s if changes_plugin else old_stamp
    block = [BLOCK_BEGIN]
    if stamp is not None:
        block.append(f"{RESTART_STAMP}{stamp:.0f} (slurmctld must start after it to run {want_type})")
    block += [f"{key}={value}" for key, value in settings.items()]
    block.append(BLOCK_END)
    return "\n".join([*kept, "", *block]) + "\n"


# -- the live side --------------------------------------------------------------------------------


def show_qos_argv() -> list[str]:
    return ["sacctmgr", "-n", "-P", "show", "qos", f"format={','.join(QOS_FIELDS)}"]


def show_marked_argv(what: str) -> list[str]:
    """QOS (`what` qos) or accounts (`what` account) with their Description: which carry `MARK`."""
    name = "Name" if what == "qos" else "Account"
    return ["sacctmgr", "-n", "-P", "show", what, f"format={name},Description"]


def marked(text: str, what: str) -> set[str]:
    """The names `sacctmgr show qos|account format=Name,Description` lists with our `MARK` (pure)."""
    return {r["name"] for r in _rows(text, ("name", "description"), what) if r["description"] == MARK}


def prune_commands(want: SlurmState, marked_qos: set[str], marked_accounts: set[str]) -> list[list[str]]:
    """The sacctmgr argv (after `sacctmgr -i`) that remove what `policy apply` created (it carries `MARK`) and the
    policy no longer names: accounts first (their associations name the QOS), then QOS. Nothing unmarked."""
    accounts = sorted(marked_accounts - {a.account for a in want.associations.values()})
    qos = sorted(marked_qos - set(want.qos))
    return [*(["delete", "account", "where", f"name={a}"] for a in accounts),
            *(["delete", "qos", "where", f"name={q}"] for q in qos)]  # fmt: skip


def show_assoc_argv(accounts: Iterable[str]) -> list[str]:
    return ["sacctmgr", "-n", "-P", "show", "assoc", "where", f"account={','.join(sorted(accounts))}",
            f"format={','.join(ASSOC_FIELDS)}"]  # fmt: skip


def _rows(text: str, fields: tuple[str, ...], what: str) -> list[dict[str, str]]:
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > MAX_SHOW_LINES:
        raise ParseError(f"sacctmgr show {what}: more than {MAX_SHOW_LINES} lines")
    out = []
    for n, line in enumerate(lines, 1):
        cells = line.split("|")
        if len(cells) != len(fields):
            raise ParseError(f"sacctmgr show {what} line {n}: {len(cells)} fields, expected {len(fields)}: {line!r}")
        out.append(dict(zip(fields, cells, strict=True)))
    return out


def parse_tres(text: str) -> dict[str, int]:
    out = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        try:
            out[key] = int(value)
        except ValueError as exc:
            raise ParseError(f"TRES {item!r} is not name=count") from exc
    return out


def parse_live(qos_text: str, assoc_text: str) -> SlurmState:
    """The state `sacctmgr -n -P show qos|assoc format=...` (QOS_FIELDS, ASSOC_FIELDS) describes."""
    qos = {}
    for row in _rows(qos_text, QOS_FIELDS, "qos"):
        try:
            priority = int(row["Priority"] or 0)
        except ValueError as exc:
            raise ParseError(f"sacctmgr show qos: priority {row['Priority']!r} of {row['Name']!r}") from exc
        qos[row["Name"]] = Qos(row["Name"], priority, frozenset(filter(None, row["Preempt"].split(","))),
                               row["PreemptMode"], row["MaxTRESPU"], row["MaxWall"])  # fmt: skip
    assocs = {}
    for row in _rows(assoc_text, ASSOC_FIELDS, "assoc"):
        share = row["Fairshare"]
        a = Association(row["Account"], row["User"], parse_tres(row["GrpTRES"]),
                        int(share) if share.isdigit() else 1, frozenset(filter(None, row["QOS"].split(","))),
                        row["DefaultQOS"])  # fmt: skip
        assocs[a.key] = a
    return SlurmState(qos, assocs)


@dataclass(frozen=True)
class Drift:
    kind: str  # "qos" or "association"
    name: str
    setting: str
    want: str
    have: str | None  # None: the object is missing

    def __str__(self) -> str:
        if self.have is None:
            return f"{self.kind} {self.name}: missing"
        have, want = self.have or "(none)", self.want or "(none)"
        return f"{self.kind} {self.name}: {self.setting} is {have}, policy says {want}"


def drift(want: SlurmState, have: SlurmState) -> list[Drift]:
    """What differs between the policy's state and the live one, for the objects the policy owns (QOS of
    its tiers, its teams' accounts and members); objects the policy does not name are not its business."""
    out: list[Drift] = []
    for name, q in sorted(want.qos.items()):
        live = have.qos.get(name)
        if live is None:
            out.append(Drift("qos", name, "", "", None))
            continue
        theirs = live.settings()
        for key, value in q.settings().items():
            if theirs[key] != value:
                out.append(Drift("qos", name, key, value, theirs[key]))
    for assoc_key, a in sorted(want.associations.items()):
        label = a.account if not a.user else f"{a.account}/{a.user}"
        live_a = have.associations.get(assoc_key)
        if live_a is None:
            out.append(Drift("association", label, "", "", None))
            continue
        live_settings = live_a.settings()
        for setting, value in a.settings().items():
            if setting == "GrpTRES":
                # Only the GPU types the policy speaks of; a zero cap and no cap differ (0 blocks all).
                mine = {k: v for k, v in live_a.grp_tres.items() if k in a.grp_tres}
                if mine != dict(a.grp_tres):
                    out.append(Drift("association", label, setting, value, tres_text(mine)))
            elif live_settings[setting] != value:
                out.append(Drift("association", label, setting, value, live_settings[setting]))
    return out


def fix_commands(want: SlurmState, found: list[Drift]) -> list[list[str]]:
    """The sacctmgr argv (after `sacctmgr -i`) that bring the live state to `want`, given its drift."""
    missing = SlurmState(
        {d.name: want.qos[d.name] for d in found if d.kind == "qos" and d.have is None},
        {k: a for k, a in want.associations.items()
         if any(d.kind == "association" and d.have is None and d.name == (a.account if not a.user else
                f"{a.account}/{a.user}") for d in found)},
    )  # fmt: skip
    cmds = create_commands(missing)
    for d in found:
        if d.have is None:
            continue
        if d.kind == "qos":
            # An empty value clears: `Preempt=` takes an empty list, the limits take -1.
            value = d.want or ("" if d.setting == "Preempt" else "-1")
            cmds.append(["modify", "qos", "where", f"name={d.name}", "set", f"{d.setting}={value}"])
        else:
            account, _, user = d.name.partition("/")
            a = want.associations[(account, user)]
            value = tres_text(a.grp_tres) if d.setting == "GrpTRES" else d.want
            if user:
                where = ["where", f"name={user}", f"account={account}"]
                cmds.append(["modify", "user", *where, "set", f"{d.setting}={value}"])
            else:
                cmds.append(["modify", "account", "where", f"name={account}", "set", f"{d.setting}={value}"])
    return cmds
