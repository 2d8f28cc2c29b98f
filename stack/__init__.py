"""The local stack `gpuledger up` runs, and the live engine harnesses of the tests and `gpuledger dev`: the Kafka
broker launcher, TLS material, passwords and
ACLs, the schema registry, the embedded ClickHouse server and the supervisor that owns them."""
