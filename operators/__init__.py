"""Kubernetes operators of the like platform (Kopf)."""

__all__: list[str] = []
