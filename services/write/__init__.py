"""The like-write service: POST /v1/likes, accepted once, never lost."""
