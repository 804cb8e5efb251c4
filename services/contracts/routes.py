"""The public HTTP routes, defined once: the services serve them, the gateway routes (and mirrors)
them, the hot-key sampler accepts the mirrored copies, and the tests call them."""

from __future__ import annotations

API_PREFIX = "/v1"
WRITE_PATH = f"{API_PREFIX}/likes"  # POST: like or unlike
READ_TEMPLATE = f"{API_PREFIX}/posts/{{post_id}}/likes"  # GET: one post's count
READ_PATH_REGEX = rf"^{API_PREFIX}/posts/[^/]+/likes$"
BATCH_READ_PATH = f"{API_PREFIX}/posts/likes:batch"  # POST {"post_ids": [...]}: a feed page
# The client's address as the CDN passes it to the origin; the gateway's per-IP limit keys on it
CLIENT_IP_HEADER = "CF-Connecting-IP"


def relative(path: str) -> str:
    """A route under API_PREFIX as a FastAPI router with that prefix declares it."""
    if not path.startswith(API_PREFIX + "/"):
        raise ValueError(f"{path} is not under {API_PREFIX}")
    return path[len(API_PREFIX) :]


def read_path(post_id: str) -> str:
    return READ_TEMPLATE.format(post_id=post_id)
