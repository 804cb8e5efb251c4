"""The canary: likes and unlikes its own posts through the gateway, as a user would, and compares
what the read path answers with the reconciler's truth (the edge-store's distinct liked edges).
The seed's canary_drift_ratio and count_flicker_per_user come from its counters
(infra/alert_rules.py records both)."""
