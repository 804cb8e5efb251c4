"""The like-read service: counts and has_liked that never 5xx (see core.py)."""
