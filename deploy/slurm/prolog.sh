#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/prolog.d/gpuledger.sh, PrologFlags=Alloc recommended).
# Records the job's start on this node with SLURM_JOB_GPUS into the local spool. Bounded to 5 s and
# always exits 0: accounting must never delay or fail a job.
HOOK="${GPULEDGER_HOOK:-/etc/slurm/gpuledger_hook.py}"
PYTHON="${GPULEDGER_PYTHON:-/usr/bin/python3}"
timeout 5 "$PYTHON" "$HOOK" start >/dev/null 2>&1 || true
exit 0
