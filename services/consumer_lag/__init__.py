"""The consumer-lag exporter: `likes_consumer_lag_seconds`, read from Kafka, not from the consumers
(a dead or hung consumer reports nothing about itself, and its lag is what matters then)."""
