"""Generated like traffic, humans and bot rings, labelled: what the abuse model trains and is
evaluated on until labelled production traffic exists. Deterministic for a seed.

What each class does (the seed's four signals, services/contracts/signals.py):

- Humans like at a steady, sparse pace (Poisson, a rate drawn log-uniformly from 3 an hour to 3 a
  minute), from one or two addresses in /24s of their own, on their own device, with accounts
  from days to years old.
- Bots come in rings (`RING_SIZE` accounts) that work a few posts together. A ring has four
  tells, each drawn on its own (the RING_* odds), so rings differ in how many they show: bursts
  (5 to 30 likes seconds apart, a few times in the window, the accounts together) or a human
  pace; one /24 whose hosts it rotates through like after like, or residential proxies (an exit
  or two per account, anywhere, as a human's); a few device fingerprints shared by every account,
  or one each; fresh accounts (minutes to days old) or bought old ones.

The classes overlap as real traffic does (the HUMAN_* odds): some humans binge (bursts of likes
seconds apart), sit behind a carrier's NAT (a /24 shared with tens of users, the address changing
within it), share a device and connection with their household, or signed up in the last days.
A ring that shows one tell looks like the humans who show the same one, and one that shows none
is a human as far as these signals go: the model cannot be perfect here, as it cannot in
production. Some accounts of either class send no device fingerprint or no address (the MISSING_*
odds, the same for both): a like without a signal is judged on the others. (The odds were set
so that the classes are told apart about as well as the goals ask, ROC AUC 0.94-0.99 on held-out
users over seeds 0-9, not trivially: with a tell in most rings, it was 0.9999.)
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from services.abuse.features import Observation

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z: generated time is fixed, never the clock's
DAY = 86400.0

# how often each behaviour occurs: humans that look like bots in one way, rings that show a tell
HUMAN_NEW = 0.10  # an account from the last three days
HUMAN_CARRIER_NAT = 0.15  # on a carrier's /24 with many other users, the address changing
HUMAN_HOUSEHOLD = 0.06  # shares a device and an address with 1 to 3 others
HUMAN_BINGE = 0.12  # one or two bursts of likes seconds apart
RING_BURSTS = 0.55
RING_ONE_SUBNET = 0.45  # else residential proxies: an exit or two each, anywhere
RING_SHARED_DEVICES = 0.5  # else a device per account
RING_FRESH = 0.55  # else bought accounts, weeks to years old
RING_SIZE = (2, 15)
# signals a client does not send, per account and alike for both classes, so that the model learns
# a missing signal as "unknown", never as evidence: a web client without the fingerprinting SDK,
# a path that reaches the write service without the CDN's header (locally: a client without one)
MISSING_DEVICE = 0.08
MISSING_IP = 0.03


@dataclass(frozen=True)
class Traffic:
    """How much traffic, and how much of it bots."""

    users: int = 4000
    bot_share: float = 0.15  # of the accounts (about as much of the likes)
    duration_s: float = 3600.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.users < 10:
            raise ValueError(f"users must be at least 10, not {self.users}")
        if not 0.0 < self.bot_share < 1.0:
            raise ValueError(f"bot_share must be within (0, 1), not {self.bot_share}")
        if self.duration_s <= 0:
            raise ValueError(f"duration_s must be positive, not {self.duration_s}")


class _World:
    """The generator's shared state: its random source, the addresses, accounts and posts used."""

    def __init__(self, tr: Traffic) -> None:
        self.rng = random.Random(f"abuse-traffic-{tr.seed}")
        self.start, self.end = T0, T0 + tr.duration_s
        self.subnets: set[str] = set()
        self.ids: set[str] = set()
        self.posts = [f"p{n:05d}" for n in range(5000)]
        # Zipf: a few posts get most likes (cumulative weights: choices() sums them otherwise)
        self.popularity = list(itertools.accumulate(1.0 / (n + 1) for n in range(len(self.posts))))
        self.firsts = [n for n in range(11, 224) if n not in (100, 127, 169, 172)]

    def subnet(self) -> str:
        """A /24 no one has used yet."""
        while True:
            r = self.rng
            s = f"{r.choice(self.firsts)}.{r.randrange(256)}.{r.randrange(256)}"
            if s not in self.subnets:
                self.subnets.add(s)
                return s

    def host(self, subnet: str) -> str:
        return f"{subnet}.{self.rng.randrange(1, 255)}"

    def account(self, created: float, bot: bool) -> _Account:
        while (uid := f"u{self.rng.getrandbits(48):012x}") in self.ids:
            pass
        self.ids.add(uid)
        return _Account(uid, created, bot)

    def device(self) -> str:
        return f"d{self.rng.getrandbits(64):016x}"

    def popular_post(self) -> str:
        return self.rng.choices(self.posts, cum_weights=self.popularity)[0]

    def loguniform(self, low: float, high: float) -> float:
        return math.exp(self.rng.uniform(math.log(low), math.log(high)))

    def poisson(self, rate: float) -> list[float]:
        out, t = [], self.start + self.rng.expovariate(rate)
        while t < self.end:
            out.append(t)
            t += self.rng.expovariate(rate)
        return out

    def sends(self) -> tuple[bool, bool]:
        """Whether an account's likes carry an address and a device fingerprint."""
        return self.rng.random() >= MISSING_IP, self.rng.random() >= MISSING_DEVICE

    def burst(self, at: float, n: int, gap: tuple[float, float]) -> list[float]:
        out, t = [], at
        for _ in range(n):
            out.append(t)
            t += self.rng.uniform(*gap)
        return out


@dataclass
class _Account:
    user_id: str
    created: float
    bot: bool


def generate(traffic: Traffic = Traffic()) -> list[Observation]:
    """Every like of the window, sorted by time (then user, post), each labelled `bot`."""
    w = _World(traffic)
    bots = max(5, round(traffic.users * traffic.bot_share))
    likes = list(_humans(w, traffic.users - bots, traffic))
    made = 0
    while made < bots:
        size = min(bots - made, w.rng.randint(*RING_SIZE))
        made += size
        likes += _ring(w, size)
    return sorted(likes, key=lambda o: (o.ts, o.user_id, o.post_id))


def _humans(w: _World, n: int, tr: Traffic) -> Iterator[Observation]:
    rng = w.rng
    carriers = [w.subnet() for _ in range(max(3, tr.users // 150))]  # carrier NAT /24s
    household: list[tuple[str, str]] = []  # the device and IP the next accounts share
    for _ in range(n):
        a = w.account(w.start - w.loguniform(3 * DAY, 6 * 365 * DAY), bot=False)
        if rng.random() < HUMAN_NEW:  # signed up recently (perhaps during the window)
            a.created = w.start - w.loguniform(600, 3 * DAY) + rng.uniform(0, tr.duration_s)
        dev = w.device()
        if rng.random() < HUMAN_CARRIER_NAT:  # a carrier's /24: addresses change within it
            sub = rng.choice(carriers)
            ips = [w.host(sub) for _ in range(rng.randint(2, 6))]
        else:
            ips = [w.host(w.subnet()) for _ in range(rng.choice((1, 1, 1, 2)))]
        if household:  # the household's device and connection
            dev, ip = household.pop()
            ips = [ip]
        elif rng.random() < HUMAN_HOUSEHOLD:
            household = [(dev, ips[0])] * rng.randint(1, 3)
        times = w.poisson(w.loguniform(3 / 3600, 3 / 60))
        if rng.random() < HUMAN_BINGE:  # scrolling and liking, seconds apart
            for _ in range(rng.randint(1, 2)):
                times += w.burst(rng.uniform(w.start, w.end), rng.randint(5, 25), (0.5, 5.0))
        sends_ip, sends_device = w.sends()
        for t in times:
            if w.start <= t < w.end and t >= a.created:
                yield Observation(a.user_id, w.popular_post(), t,
                                  rng.choice(ips) if sends_ip else None,
                                  dev if sends_device else None, a.created, bot=False)  # fmt: skip


def _ring(w: _World, size: int) -> Iterator[Observation]:
    """One ring's likes, its tells drawn each on its own (the module's docstring)."""
    rng = w.rng
    bursty = rng.random() < RING_BURSTS
    one_subnet = rng.random() < RING_ONE_SUBNET
    shared_devices = rng.random() < RING_SHARED_DEVICES
    fresh = rng.random() < RING_FRESH
    targets = rng.sample(w.posts, rng.randint(1, 5))
    subnet = w.subnet()
    fleet = [w.device() for _ in range(rng.randint(1, 4))]
    campaigns = sorted(rng.uniform(w.start, w.end - 60) for _ in range(rng.randint(1, 4)))
    for _ in range(size):
        if fresh:
            created = w.start - w.loguniform(600, 5 * DAY) + rng.uniform(0, w.end - w.start)
        else:  # bought accounts
            created = w.start - w.loguniform(30 * DAY, 3 * 365 * DAY)
        a = w.account(created, bot=True)
        own_device = w.device()
        if bursty:
            times: list[float] = []
            for c in campaigns:
                if rng.random() < 0.85:
                    times += w.burst(c + rng.uniform(0, 60), rng.randint(5, 30), (0.3, 4.0))
        else:  # at a human pace
            times = w.poisson(w.loguniform(10 / 3600, 3 / 60))
        exits = [w.host(w.subnet()) for _ in range(rng.choice((1, 1, 2)))]  # residential proxies
        sends_ip, sends_device = w.sends()
        for t in sorted(times):
            if not (w.start <= t < w.end and t >= a.created):
                continue
            ip = w.host(subnet) if one_subnet else rng.choice(exits)
            dev = rng.choice(fleet) if shared_devices else own_device
            post = rng.choice(targets) if rng.random() < 0.8 else rng.choice(w.posts)
            yield Observation(a.user_id, post, t, ip if sends_ip else None,
                              dev if sends_device else None, a.created, bot=True)  # fmt: skip
