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
from decimal import Decimal

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


def create_commands(state: SlurmState) -> list[list[str]]:
    """The sacctmgr argv (after `sacctmgr -i`) that create `state` on an empty cluster, in order."""
    cmds: list[list[str]] = []
    for q in sorted(state.qos.values(), key=lambda q: q.priority):  # preempted QOS exist before their preemptors
        cmds.append(["add", "qos", q.name])
        cmds.append(["modify", "qos", "where", f"name={q.name}", "set", *_assignments(q.settings())])
    for a in sorted(state.associations.values(), key=lambda a: (a.account, a.user)):
        s = a.settings()
        if not a.user:
            cmds.append(["add", "account", a.account, f"Fairshare={a.fairshare}"])
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


def render_conf(policy: Policy) -> str:
    fs = policy.fair_share
    half_life = fs.half_life
    lines = [
        "# slurm.conf fragment generated by `gpuledger policy render --engine slurm` from policy.yaml.",
        "PriorityType=priority/multifactor",
        f"PriorityWeightFairshare={fs.weight_fairshare}",
        f"PriorityWeightAge={fs.weight_age}",
        f"PriorityWeightQOS={fs.weight_qos}",
        f"PriorityWeightJobSize={fs.weight_job_size}",
        f"PriorityMaxAge={fs.max_age_days}-0",
    ]
    if half_life is None:
        lines += ["# fair_share.mode accumulate: usage never decays and is never reset",
                  "PriorityDecayHalfLife=0", "PriorityUsageResetPeriod=NONE"]  # fmt: skip
    else:
        minutes = int(half_life * 24 * 60)
        days, rest = divmod(minutes, 24 * 60)
        lines.append(f"PriorityDecayHalfLife={days}-{rest // 60:02d}:{rest % 60:02d}")
    lines += [
        "PreemptType=preempt/qos",
        "PreemptMode=REQUEUE",
        "AccountingStorageEnforce=associations,limits,qos",
        "AccountingStorageTRES=gres/gpu," + ",".join(f"gres/gpu:{g.slurm_gres}" for g in policy.generations.values()),
    ]
    return "\n".join(lines) + "\n"


# -- the live side --------------------------------------------------------------------------------


def show_qos_argv() -> list[str]:
    return ["sacctmgr", "-n", "-P", "show", "qos", f"format={','.join(QOS_FIELDS)}"]


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
