"""Metric mappings as data files (see README.md); read by producers.mapping and producers.dcgm."""
