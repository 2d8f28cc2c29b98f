"""The local stack `gpuledger up` runs: the Kafka broker launcher, TLS material, passwords and
ACLs, the schema registry, the embedded ClickHouse server and the supervisor that owns them."""
