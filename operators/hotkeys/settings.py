"""The operator's settings: the shared LIKES_* settings plus the hot pools it copies into."""

from __future__ import annotations

from services.contracts.settings import Settings, parse_nodes


class OperatorSettings(Settings):
    # host:port of each hot pool, comma-separated, in pool order (pool i is the i-th address)
    hot_pools: str = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103,127.0.0.1:7104"

    ENDPOINTS = (*Settings.ENDPOINTS, "hot_pools")

    @property
    def hot_pool_addresses(self) -> list[tuple[str, int]]:
        return parse_nodes(self.hot_pools) if self.hot_pools else []
