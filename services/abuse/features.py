"""The abuse model's features, computed like by like from what was seen up to and including that
like: the same code builds the training rows offline and the scorer's rows online, so the model
is never served features computed differently from the ones it learnt.

Columns (`FEATURE_NAMES`, in order):

- the user's pace: likes in the last 10 s, 60 s and hour (this one included), and the seconds
  since their previous like (`HORIZON_S` when there was none within the hour);
- IP-cluster entropy: the Shannon entropy (bits) of the /24s of the user's likes in the last
  hour, and of their addresses within those /24s (H(address) - H(/24): a ring that rotates the
  hosts of one /24 scores high on this one and 0 on the first); distinct users seen on this
  like's /24 and on its address in the last hour, and likes from its /24 in the last 60 s;
- device sharing: distinct users seen on this like's device fingerprint in the last hour, and
  distinct devices of this user;
- the account's age at the like, in seconds.

A missing signal (an event written before the signals, services/contracts/signals.py) is NaN in
the columns it feeds; the classifier (HistGradientBoosting) takes NaN as "unknown".

Memory is bounded: every entry expires `HORIZON_S` after it was seen; a user keeps at most
`MAX_EVENTS` likes (a faster user's counts saturate there: the model sees "very many"); a /24,
address or device keeps at most `MAX_USERS` users (the least recently seen goes first) and
`MAX_EVENTS` like times; each table (users, /24s, addresses, devices) keeps at most `max_keys`
keys, evicting the least recently seen. So at most about 4 x `max_keys` x `MAX_EVENTS` entries,
and in practice what the last hour's traffic holds.

Time is the like's own (`ts`, its `occurred_at`), never the clock's, so a replay computes the
same rows. Likes may arrive slightly out of order (partitions interleave): a like older than the
newest one seen counts as of the newest, so the windows only move forward.
"""

from __future__ import annotations

import ipaddress
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from services.contracts import events

HORIZON_S = 3600.0  # the longest window; nothing older is kept
# the user's pace (likes_10s, likes_60s) and a /24's likes (subnet_likes_60s): the in-memory and
# the shared store (services/abuse/shared_features.py, its script's arguments) both read these
PACE_SHORT_S = 10.0
PACE_MINUTE_S = 60.0
SUBNET_WINDOW_S = 60.0
MAX_EVENTS = 2048  # likes kept per user, and like times per /24
MAX_USERS = 1024  # users kept per /24, address or device
MAX_KEYS = 2_000_000  # keys per table (users, /24s, addresses, devices)

FEATURE_NAMES: tuple[str, ...] = (
    "likes_10s",
    "likes_60s",
    "likes_1h",
    "since_previous_s",
    "subnet_entropy",
    "ip_in_subnet_entropy",
    "subnet_users_1h",
    "ip_users_1h",
    "subnet_likes_60s",
    "device_users_1h",
    "user_devices_1h",
    "account_age_s",
)
NAN = math.nan
_LN2 = math.log(2.0)


@dataclass(frozen=True, slots=True)
class Observation:
    """One like as the scorer sees it: who, what, when (epoch seconds), its signals, and for
    generated traffic the label (None: not known)."""

    user_id: str
    post_id: str
    ts: float
    client_ip: str | None
    device: str | None
    account_created: float | None  # epoch seconds
    bot: bool | None = None
    # the event's id: what makes observing it again a no-op in the shared state
    # (services/abuse/shared_features.py); None for generated traffic
    event_id: str | None = None

    @classmethod
    def from_event(cls, e: events.LikeEvent) -> Observation:
        created = None if e.account_created is None else e.account_created / 1000.0
        return cls(e.user_id, e.post_id, e.occurred_at / 1000.0, e.client_ip, e.device, created,
                   event_id=e.event_id)  # fmt: skip


def subnet_of(ip: str) -> str:
    """An IPv4 address's /24 (`a.b.c`), an IPv6 one's /64."""
    if ":" not in ip:
        return ip.rpartition(".")[0]
    try:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    except ValueError:
        return ip


class _Entropy:
    """Shannon entropy of a multiset, updated in O(1): H = ln N - (sum c ln c) / N."""

    __slots__ = ("counts", "n", "s")

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.n = 0
        self.s = 0.0

    @staticmethod
    def _f(c: int) -> float:
        return c * math.log(c) if c > 1 else 0.0

    def add(self, key: str) -> None:
        c = self.counts[key]
        self.counts[key] = c + 1
        self.s += self._f(c + 1) - self._f(c)
        self.n += 1

    def remove(self, key: str) -> None:
        c = self.counts[key]
        if c <= 1:
            del self.counts[key]
        else:
            self.counts[key] = c - 1
        self.s += self._f(c - 1) - self._f(c)
        self.n -= 1
        if self.n == 0:
            self.s = 0.0  # no float drift survives an empty window

    def bits(self) -> float:
        return entropy_bits(self.n, self.s)


def entropy_bits(n: int, s: float) -> float:
    """Shannon entropy (bits) of a multiset of `n` items whose counts c give s = sum c ln c
    (over c > 1): the one formula of both feature stores."""
    if n <= 1:
        return 0.0
    return max(0.0, (math.log(n) - s / n) / _LN2)


class _User:
    """One user's likes within the horizon: (ts, address, /24, device)."""

    __slots__ = ("devices", "ips", "last", "likes", "subnets", "w10", "w60")

    def __init__(self) -> None:
        self.likes: deque[tuple[float, str | None, str | None, str | None]] = deque()
        self.w10: deque[float] = deque()
        self.w60: deque[float] = deque()
        self.ips = _Entropy()
        self.subnets = _Entropy()
        self.devices: Counter[str] = Counter()
        self.last = -math.inf

    def _drop_oldest(self) -> None:
        _, ip, sub, dev = self.likes.popleft()
        if ip is not None and sub is not None:
            self.ips.remove(ip)
            self.subnets.remove(sub)
        if dev is not None:
            self.devices[dev] -= 1
            if self.devices[dev] <= 0:
                del self.devices[dev]

    def add(self, ts: float, ip: str | None, sub: str | None, dev: str | None) -> float:
        """Record a like; the seconds since the previous one within the horizon."""
        for window, span in ((self.w10, PACE_SHORT_S), (self.w60, PACE_MINUTE_S)):
            while window and window[0] <= ts - span:
                window.popleft()
            window.append(ts)
        while self.likes and (self.likes[0][0] <= ts - HORIZON_S or len(self.likes) >= MAX_EVENTS):
            self._drop_oldest()
        since = ts - self.likes[-1][0] if self.likes else HORIZON_S
        self.likes.append((ts, ip, sub, dev))
        if ip is not None and sub is not None:
            self.ips.add(ip)
            self.subnets.add(sub)
        if dev is not None:
            self.devices[dev] += 1
        if len(self.w60) > MAX_EVENTS:
            self.w60.popleft()
        if len(self.w10) > MAX_EVENTS:
            self.w10.popleft()
        self.last = ts
        return since


class _Seen:
    """Who was seen on one /24, address or device within the horizon, and when it was liked."""

    __slots__ = ("last", "times", "users")

    def __init__(self) -> None:
        self.users: OrderedDict[str, float] = OrderedDict()  # user -> last seen, oldest first
        self.times: deque[float] = deque()  # like times within SUBNET_WINDOW_S
        self.last = -math.inf

    def add(self, ts: float, user: str) -> None:
        users = self.users
        users[user] = ts
        users.move_to_end(user)
        while users and (next(iter(users.values())) <= ts - HORIZON_S or len(users) > MAX_USERS):
            users.popitem(last=False)
        times = self.times
        while times and (times[0] <= ts - SUBNET_WINDOW_S or len(times) >= MAX_EVENTS):
            times.popleft()
        times.append(ts)
        self.last = ts


T = TypeVar("T", bound=_User | _Seen)


class _Table(Generic[T]):
    """Keys in the order they were last seen: expiring the stale ones is popping the front."""

    def __init__(self, make: Callable[[], T], max_keys: int) -> None:
        self.make: Callable[[], T] = make
        self.max_keys = max_keys
        self.d: OrderedDict[str, T] = OrderedDict()

    def touch(self, key: str, now: float) -> T:
        d = self.d
        state = d.get(key)
        if state is None:
            state = d[key] = self.make()
        else:
            d.move_to_end(key)
        state.last = now  # so the front holds the stalest keys
        while len(d) > self.max_keys or next(iter(d.values())).last <= now - HORIZON_S:
            d.popitem(last=False)
        return state

    def __len__(self) -> int:
        return len(self.d)


class Features:
    """The scorer's feature state: `observe` each like in arrival order, get its row."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.users = _Table(_User, max_keys)
        self.subnets = _Table(_Seen, max_keys)
        self.ips = _Table(_Seen, max_keys)
        self.devices = _Table(_Seen, max_keys)
        self.now = -math.inf

    def observe(self, like: Observation | events.LikeEvent) -> tuple[float, ...]:
        """This like's row (`FEATURE_NAMES`), from the likes observed so far and this one."""
        o = like if isinstance(like, Observation) else Observation.from_event(like)
        ts = self.now = max(o.ts, self.now)
        ip, dev = o.client_ip or None, o.device or None
        sub = subnet_of(ip) if ip else None
        user = self.users.touch(o.user_id, ts)
        since = user.add(ts, ip, sub, dev)
        subnet_users = ip_users = subnet_likes = device_users = NAN
        if ip is not None and sub is not None:
            s = self.subnets.touch(sub, ts)
            s.add(ts, o.user_id)
            subnet_users, subnet_likes = float(len(s.users)), float(len(s.times))
            a = self.ips.touch(ip, ts)
            a.add(ts, o.user_id)
            ip_users = float(len(a.users))
        if dev is not None:
            d = self.devices.touch(dev, ts)
            d.add(ts, o.user_id)
            device_users = float(len(d.users))
        has_ip = user.subnets.n > 0
        subnet_h = user.subnets.bits() if has_ip else NAN
        ip_h = user.ips.bits() - subnet_h if has_ip else NAN
        age = NAN if o.account_created is None else max(0.0, ts - o.account_created)
        return (
            float(len(user.w10)),
            float(len(user.w60)),
            float(len(user.likes)),
            since,
            subnet_h,
            max(0.0, ip_h) if has_ip else NAN,
            subnet_users,
            ip_users,
            subnet_likes,
            device_users,
            float(len(user.devices)),
            age,
        )

    def observe_many(
        self, likes: Sequence[Observation | events.LikeEvent]
    ) -> list[tuple[float, ...]]:
        """Each like's row, observed in order (the scorer's one interface to both stores)."""
        return [self.observe(like) for like in likes]

    def keys(self) -> dict[str, int]:
        """How many keys each table holds (the memory bound's unit)."""
        return {"users": len(self.users), "subnets": len(self.subnets), "ips": len(self.ips),
                "devices": len(self.devices)}  # fmt: skip
