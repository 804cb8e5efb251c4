"""Contracts shared by every service and worker: events, key names, settings, clients, auth."""

from services.contracts import auth, events, keys, settings

__all__ = ["auth", "events", "keys", "settings"]
