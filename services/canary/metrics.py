"""The canary's series (names in services/contracts/metrics.py: the rules read them)."""

from __future__ import annotations

from prometheus_client import Counter

from services.contracts import metrics as names

TURNS = Counter(
    names.CANARY_TURNS,
    "Canary turns (a like or unlike through the gateway, then the count read for the hold) by "
    "result: match (the truth after the hold), drift (another count), error (not judged)",
    ["result"],
)
READS_AFTER_LIKE = Counter(
    names.CANARY_READS_AFTER_LIKE, "Counts the canary read during the hold after its own like"
)
FLICKERS = Counter(
    names.CANARY_FLICKERS,
    "Reads after the canary's own like that answered a count below one it had already seen",
)
