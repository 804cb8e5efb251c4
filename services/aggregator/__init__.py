"""The counter aggregator: a Kafka worker folding like events into counter-store cells and the
count-cache, once per 1 s window, idempotently under replay."""
