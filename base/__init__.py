"""The bottom layer: errors, settings, output safety, logging, stop handling, metrics and the one
way to build a Kafka client. Imports nothing of the project above it."""
