"""`shard_for` that follows the split flags in etcd (`/likes/split/<post>`): a split post's
events spread over `post_id:0..n-1` Kafka keys at random; the rest use shard 0. The flags are
polled in the background and survive an etcd outage for 5 minutes (then nothing is split)."""

from __future__ import annotations

import random

from services.contracts import etcd, hotkeys, keys
from services.contracts.settings import Settings


def split_view(settings: Settings) -> hotkeys.PrefixView[hotkeys.SplitFlag]:
    return hotkeys.PrefixView(
        settings.etcd_host,
        settings.etcd_port,
        keys.SPLIT_PREFIX,
        hotkeys.decode_split,
        credentials=etcd.credentials(settings),
        ca_file=settings.tls_ca_file,
    )


class SplitRouter:
    def __init__(self, view: hotkeys.PrefixView[hotkeys.SplitFlag]) -> None:
        self.view = view

    def shard_for(self, post_id: str) -> int:
        flag = self.view.current().get(post_id)
        return 0 if flag is None else random.randrange(flag.factor)
