"""The stream runtime: how records cross the Kafka boundary, below the components and above the contracts.

`publish` (encode and produce), `consume` (decode, validate or dead-letter; the sinks' consumer loop),
`agents` (faust apps the project's way, with the defenses against faust's behaviours: `streams/README.md`),
`eventlog` (a workflow topic read whole) and `topics_admin` (`gpuledger topics apply`). The contracts these
carry (schemas, records, the codec, the topic catalogue) are `schemas/`, which imports no Kafka client.
"""
