"""One reconcile pass against etcd and Redis: read the hot set, decide, enforce, report.

Runs the same inside the Kopf operator (a timer per HotKeyPolicy) and as the local stack's loop
(no Kubernetes API). Its memory (which posts are hot, since when) is rebuilt from etcd's
`hotpool/` and `split/` keys on start, so a restarted operator neither drops nor re-promotes.
While etcd is unreachable it keeps refreshing the replicas of the last good hot set for the
grace period, changes nothing, and raises EtcdUnavailable for the caller to retry.

The `hotkeys-freeze` kill switch (or `panic`) freezes it: no promotion, demotion, split or
unsplit, while the replicas of the current hot set are kept fresh. The switches are read with the
hot set each pass, and the last value read holds through an etcd outage (services/contracts/
flags.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aetcd
from redis.asyncio.cluster import RedisCluster

from operators.hotkeys.decisions import HotEntry, Plan, decide
from operators.hotkeys.hot_pools import HotPools, source_cluster
from operators.hotkeys.policy import Policy
from operators.hotkeys.settings import OperatorSettings
from services.common import observability
from services.contracts import etcd, flags, hotkeys, keys

RECONCILE_SPAN = "hotkeys reconcile"  # a pass that did something (Reconciler.tick)


class EtcdUnavailable(Exception):
    """etcd did not answer: the hot set cannot be read or changed this pass."""


@dataclass(frozen=True)
class Report:
    """What one pass did: the resource's status in the cluster, a log line locally."""

    hot_keys: list[str]
    split: list[str]
    promoted: list[str] = field(default_factory=list)
    demoted: list[str] = field(default_factory=list)
    capped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    at: str = ""
    frozen: bool = False

    def status(self) -> dict[str, Any]:
        return {
            "hotKeys": self.hot_keys,
            "splitKeys": self.split,
            "lastReconcile": self.at,
            "lastPromoted": self.promoted,
            "lastDemoted": self.demoted,
            "capped": len(self.capped),
            "errors": self.errors[-10:],
            "frozen": self.frozen,
        }


def _iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Reconciler:
    def __init__(
        self,
        etcd_host: str,
        etcd_port: int,
        source: RedisCluster,
        pools: HotPools,
        *,
        clock: Callable[[], float] = time.monotonic,
        grace_s: float = hotkeys.GRACE_S,
        timeout_s: float = 1.0,
        etcd_credentials: etcd.Credentials | None = None,
        etcd_ca_file: str | None = None,
    ) -> None:
        self.etcd_host, self.etcd_port, self.timeout_s = etcd_host, etcd_port, timeout_s
        self.etcd_credentials, self.etcd_ca_file = etcd_credentials, etcd_ca_file
        self.source, self.pools, self.clock = source, pools, clock
        self.state: dict[str, HotEntry] = {}
        self.last_good: hotkeys.LastGood[dict[str, HotEntry]] = hotkeys.LastGood({}, grace_s, clock)
        self._restored = False
        self._unreachable = False  # the last pass could not reach etcd
        self._etcd: aetcd.Client | None = None
        self.switches: dict[str, flags.State] = {}  # the last read: kept through an outage

    @property
    def frozen(self) -> bool:
        return flags.Switch.HOTKEYS_FREEZE in flags.engaged_by(self.switches)

    @classmethod
    def from_settings(cls, settings: OperatorSettings) -> Reconciler:
        """The stores the settings name: etcd, the count-cache (the source) and the hot pools."""
        auth = settings.redis_auth
        return cls(
            settings.etcd_host,
            settings.etcd_port,
            source_cluster(settings.count_cache_startup, password=auth),
            HotPools(settings.hot_pool_addresses, password=auth),
            etcd_credentials=etcd.credentials(settings),
            etcd_ca_file=settings.tls_ca_file,
        )

    # -- etcd -------------------------------------------------------------------------------
    async def _client(self) -> aetcd.Client:
        if self._etcd is None:
            self._etcd = etcd.client(
                self.etcd_host,
                self.etcd_port,
                self.etcd_credentials,
                self.timeout_s,
                self.etcd_ca_file,
            )
        return await etcd.connected(self._etcd)  # a login has its own, longer deadline

    async def _prefix(self, prefix: str) -> dict[str, bytes]:
        client = await self._client()
        result = await asyncio.wait_for(client.get_prefix(prefix.encode()), self.timeout_s)
        return {hotkeys.post_of(kv.key, prefix): kv.value for kv in result}

    async def _put(self, key: str, value: bytes) -> None:
        await asyncio.wait_for((await self._client()).put(key.encode(), value), self.timeout_s)

    async def _delete(self, key: str) -> None:
        await asyncio.wait_for((await self._client()).delete(key.encode()), self.timeout_s)

    async def _drop_etcd(self) -> None:
        client, self._etcd = self._etcd, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()

    async def _restore(self, now: float) -> None:
        """Adopt the hot set a previous operator left in etcd."""
        pools = await self._prefix(hotkeys.HOTPOOL_PREFIX)
        splits = await self._prefix(keys.SPLIT_PREFIX)
        for post in pools:
            flag = hotkeys.decode_split(splits[post]) if post in splits else None
            split = flag is not None and flag.by == "operator"
            self.state[post] = HotEntry(since=now, last_hot=now, rate=0.0, split=split)
        self._restored = True

    # -- one pass ---------------------------------------------------------------------------
    async def tick(self, policy: Policy) -> Report:
        """One pass. A pass that changed the hot set or had errors is a span, and so is the
        first of a run of passes that could not reach etcd; the quiet ones (several a second)
        are not: a trace per pass would say nothing and crowd out the ones that do."""
        start = time.time_ns()
        try:
            report = await self._tick(policy)
        except EtcdUnavailable as e:
            if not self._unreachable:
                observability.record_span(RECONCILE_SPAN, start, {}, e)
            self._unreachable = True
            raise
        self._unreachable = False
        if report.promoted or report.demoted or report.errors:
            attributes = {
                "likes.hotkeys.promoted": report.promoted,
                "likes.hotkeys.demoted": report.demoted,
                "likes.hotkeys.hot": len(report.hot_keys),
            }
            observability.record_span(
                RECONCILE_SPAN, start, attributes, "; ".join(report.errors) or None
            )
        return report

    async def _tick(self, policy: Policy) -> Report:
        now = self.clock()
        try:
            if not self._restored:
                await self._restore(now)
            switches = await self._prefix(flags.PREFIX)
            raw = await self._prefix(keys.HOTKEYS_PREFIX)
            splits = await self._prefix(keys.SPLIT_PREFIX)
        except Exception as e:
            await self._drop_etcd()
            # the data plane keeps the last good config: keep its replicas fresh, for a while
            held = self.last_good.get()
            await self._refresh(policy, held, [])
            raise EtcdUnavailable(f"etcd {self.etcd_host}:{self.etcd_port}: {e!r}") from e
        self.switches = {
            name: state for name, raw_state in switches.items()
            if (state := flags.decode(raw_state)) is not None
        }  # fmt: skip
        errors: list[str] = []
        if self.frozen:  # on-call's lever: keep the hot set as it is, and its copies fresh
            await self._refresh(policy, self.state, errors)
            self.last_good.ok(self.state)
            return Report(
                hot_keys=sorted(self.state),
                split=sorted(p for p, e in self.state.items() if e.split),
                errors=errors,
                at=_iso(),
                frozen=True,
            )
        observed = {p: hotkeys.decode_hot(v) for p, v in raw.items()}
        plan = decide(policy, observed, self.state, now)
        try:
            await self._apply(policy, plan, splits, errors)
        except Exception as e:
            await self._drop_etcd()
            raise EtcdUnavailable(f"etcd write failed mid-pass: {e!r}") from e
        self.state = plan.state
        self.last_good.ok(plan.state)
        return Report(
            hot_keys=plan.refresh,
            split=sorted(p for p, e in plan.state.items() if e.split),
            promoted=plan.promote,
            demoted=plan.demote,
            capped=plan.capped,
            errors=errors,
            at=_iso(),
        )

    async def _apply(
        self, policy: Policy, plan: Plan, splits: dict[str, bytes], errors: list[str]
    ) -> None:
        ms = hotkeys.now_ms()
        chosen = self.pools.pick(policy.replication_factor)
        addresses = [self.pools.addresses[i] for i in chosen]
        # demote first: flag away before replicas go, so no reader is sent to a missing copy
        for post in plan.demote:
            await self._delete(hotkeys.HOTPOOL_PREFIX + post)
            errors += [f"drop {post}: {e!r}" for e in await self.pools.drop(post)]
        for post in plan.unsplit:
            flag = hotkeys.decode_split(splits[post]) if post in splits else None
            if flag is not None and flag.by == "operator":  # on-call's manual splits stay
                await self._delete(keys.SPLIT_PREFIX + post)
        await self._refresh(policy, plan.state, errors)
        for post in plan.promote:  # replicas were written by _refresh: now point readers there
            await self._put(hotkeys.HOTPOOL_PREFIX + post, hotkeys.encode_pools(addresses, ms))
        for post in plan.split:
            if post not in splits:
                flag = hotkeys.SplitFlag(policy.split_factor, "operator", ms)
                await self._put(keys.SPLIT_PREFIX + post, flag.encode())

    async def _refresh(self, policy: Policy, hot: dict[str, HotEntry], errors: list[str]) -> None:
        """Copy every hot post's aggregate into its pools (one pipeline to the source)."""
        if not hot:
            return
        posts = sorted(hot)
        try:
            sources = await asyncio.gather(
                *(self.source.hgetall(keys.count_key(p)) for p in posts), return_exceptions=True
            )
        except Exception as e:
            errors.append(f"count-cache: {e!r}")
            return
        chosen = self.pools.pick(policy.replication_factor)
        copies = []
        for post, src in zip(posts, sources, strict=True):
            if isinstance(src, BaseException):
                errors.append(f"count-cache {post}: {src!r}")
            elif src:  # nothing counted yet: nothing to copy
                copies.append(self.pools.copy(post, src, policy.replica_ttl_s, chosen))
        for errs in await asyncio.gather(*copies):
            errors += [f"hot pool: {e!r}" for e in errs]

    async def close(self) -> None:
        await self._drop_etcd()
        await self.pools.close()
        with contextlib.suppress(Exception):
            await self.source.aclose()
