"""`python -m gpuledger ...`: the same CLI as the `gpuledger` command."""

from gpuledger.cli import main

main()
