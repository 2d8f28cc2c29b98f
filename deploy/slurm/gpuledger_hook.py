#!/usr/bin/env python3
"""Slurm Prolog/Epilog hook: record that a job started/ended on this node, with its GPU indices.

Standard library only, no network: it writes one small JSON file into a local spool directory
(atomically: temp file + rename) and exits 0 whatever happens, so a job is never delayed or failed
because Kafka (or anything else) is down. `gpuledger slurm spool-drain` sends the spooled records
to Kafka later and deletes them once the broker has acknowledged them.

Usage (from prolog.sh / epilog.sh):  gpuledger_hook.py start|end [--spool DIR]
Environment: GPULEDGER_SPOOL (default /var/spool/gpuledger) and the SLURM_* variables slurmd sets.
"""

import contextlib
import json
import os
import socket
import sys
import time

SPOOL_DEFAULT = "/var/spool/gpuledger"
# Variables slurmd exports to Prolog/Epilog that we keep (missing ones are simply absent).
KEEP = (
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_USER", "SLURM_JOB_UID", "SLURM_JOB_ACCOUNT", "SLURM_JOB_PARTITION",
    "SLURM_JOB_NAME", "SLURM_JOB_QOS", "SLURM_JOB_COMMENT", "SLURM_JOB_WCKEY", "SLURM_WCKEY", "SLURM_JOB_NODELIST",
    "SLURMD_NODENAME", "SLURM_CLUSTER_NAME", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID", "SLURM_HET_JOB_ID", "SLURM_HET_JOB_OFFSET", "SLURM_PACK_JOB_ID", "SLURM_JOB_START_TIME",
    "SLURM_JOB_END_TIME", "SLURM_JOB_EXIT_CODE", "SLURM_JOB_EXIT_CODE2", "SLURM_JOB_DERIVED_EC", "SLURM_SCRIPT_CONTEXT",
    "SLURM_JOB_CONSTRAINTS", "SLURM_RESTART_COUNT",
)


def build(kind, env, now):
    return {
        "version": 1,
        "kind": kind,
        "hook_ts_ms": int(now * 1000),
        "host": env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0],
        "env": {k: env[k] for k in KEEP if k in env},
    }


def spool(record, directory):
    os.makedirs(directory, mode=0o750, exist_ok=True)
    job = record["env"].get("SLURM_JOB_ID") or record["env"].get("SLURM_JOBID") or "unknown"
    name = f"{time.time_ns():019d}-{job}-{record['kind']}-{os.getpid()}.json"
    tmp = os.path.join(directory, "." + name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(record, fh, separators=(",", ":"))
    os.replace(tmp, os.path.join(directory, name))
    return name


def main(argv):
    try:
        kind = argv[1] if len(argv) > 1 else ""
        if kind not in ("start", "end"):
            sys.stderr.write("usage: gpuledger_hook.py start|end [--spool DIR]\n")
            return 0
        directory = os.environ.get("GPULEDGER_SPOOL", SPOOL_DEFAULT)
        if "--spool" in argv:
            directory = argv[argv.index("--spool") + 1]
        spool(build(kind, os.environ, time.time()), directory)
    except Exception as exc:  # never fail or delay the job
        with contextlib.suppress(Exception):
            sys.stderr.write(f"gpuledger hook: {exc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
