"""`shard_for` that follows the split flags in etcd (`/likes/split/<post>`): a split post's
events spread over `post_id:0..n-1` Kafka keys at random; the rest use shard 0. The flags are
polled in the background and survive an etcd outage for 5 minutes (then nothing is split). The
`panic` kill switch makes the router ignore them: every event on shard 0 (the aggregator sums every
shard, so a count never depends on the shard its events took)."""

from __future__ import annotations

import random

from services.contracts import etcd, flags, hotkeys, keys
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
    def __init__(
        self, view: hotkeys.PrefixView[hotkeys.SplitFlag], switches: flags.Switches | None = None
    ) -> None:
        self.view = view
        self.switches = switches

    def shard_for(self, post_id: str) -> int:
        if self.switches is not None and self.switches.engaged(flags.Switch.PANIC):
            return 0
        flag = self.view.current().get(post_id)
        return 0 if flag is None else random.randrange(flag.factor)
