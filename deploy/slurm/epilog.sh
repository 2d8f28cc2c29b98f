#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/epilog.d/gpuledger.sh). Records the job's end on this node.
# Bounded to 5 s and always exits 0.
HOOK="${GPULEDGER_HOOK:-/etc/slurm/gpuledger_hook.py}"
PYTHON="${GPULEDGER_PYTHON:-/usr/bin/python3}"
timeout 5 "$PYTHON" "$HOOK" end >/dev/null 2>&1 || true
exit 0
