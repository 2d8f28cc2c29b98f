"""The embedded ClickHouse: chDB owned by one process, served over the ClickHouse HTTP interface."""
