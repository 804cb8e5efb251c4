"""The operator's settings: the shared LIKES_* settings plus the hot pools it copies into."""

from __future__ import annotations

from services.contracts.settings import HotPoolSettings


class OperatorSettings(HotPoolSettings):
    pass
