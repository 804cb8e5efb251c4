"""The outbox relay: publishes outbox rows the write path could not, within seconds."""
