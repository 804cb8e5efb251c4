"""Starts, watches and stops the local stack's processes, by pid, with a state file on disk.

A process is "ours" only if its pid and its kernel start time both match what we recorded, so a
recycled pid is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from local.components.base import Component, ProbeFailed, Server, wait_until
from local.layout import Layout

Reporter = Callable[[str, str], None]  # (component or server name, message)


class StartError(Exception):
    """A server did not come up; carries the tail of its log for the operator."""

    def __init__(self, name: str, reason: str, log_tail: str) -> None:
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason
        self.log_tail = log_tail


@dataclass(frozen=True)
class Health:
    """One probe's answer for one server: `reason` says why it is not healthy (None if it is)."""

    address: str
    pid: int | None
    reason: str | None

    @property
    def healthy(self) -> bool:
        return self.pid is not None and self.reason is None

    @property
    def waitable(self) -> bool:
        """Running but not answering: worth waiting for (a server that is gone is not)."""
        return self.pid is not None and self.reason is not None

    def as_dict(self) -> dict[str, object]:
        return {"address": self.address, "pid": self.pid, "healthy": self.healthy}


@dataclass
class Entry:
    name: str
    component: str
    pid: int
    start_ticks: int
    address: str
    argv: list[str]


def _proc_start_ticks(pid: int) -> int | None:
    """Kernel start time of `pid` (field 22 of /proc/pid/stat), None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rest = stat[stat.rindex(")") + 2 :].split()
    if rest[0] == "Z":
        with contextlib.suppress(ChildProcessError):  # reap our own zombie child, if it is one
            os.waitpid(pid, os.WNOHANG)
        return None
    return int(rest[19])


def tail(path: Path, lines: int = 30) -> str:
    try:
        data = path.read_bytes()[-16384:].decode(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(data.splitlines()[-lines:])


class Supervisor:
    def __init__(self, layout: Layout, components: Iterable[Component]) -> None:
        self.layout = layout
        self.components = {c.name: c for c in components}
        self._lock = threading.Lock()

    # -- state ---------------------------------------------------------------------------
    def _load(self) -> dict[str, Entry]:
        try:
            raw = json.loads(self.layout.state_file.read_text())
        except FileNotFoundError:
            return {}
        return {k: Entry(**v) for k, v in raw.items()}

    def _save(self, entries: dict[str, Entry]) -> None:
        self.layout.home.mkdir(parents=True, exist_ok=True)
        tmp = self.layout.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({k: asdict(v) for k, v in entries.items()}, indent=2))
        tmp.replace(self.layout.state_file)

    def _update(self, entry: Entry | None, remove: str | None = None) -> None:
        with self._lock:
            entries = self._load()
            if entry is not None:
                entries[entry.name] = entry
            if remove is not None:
                entries.pop(remove, None)
            self._save(entries)

    def running(self) -> dict[str, Entry]:
        """Recorded entries whose process is still the one we started."""
        return {k: e for k, e in self._load().items() if self.is_alive(e)}

    @staticmethod
    def is_alive(e: Entry) -> bool:
        return _proc_start_ticks(e.pid) == e.start_ticks

    def all_servers(self) -> dict[str, tuple[Component, Server]]:
        return {s.name: (c, s) for c in self.components.values() for s in c.servers()}

    # -- start ---------------------------------------------------------------------------
    def _spawn(self, comp: Component, srv: Server) -> Entry:
        self.layout.ensure()
        log = self.layout.log_file(srv.name).open("ab")
        env = {**os.environ, **srv.env} if srv.inherit_env else dict(srv.env)
        proc = subprocess.Popen(
            srv.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=srv.cwd or self.layout.home,
            env=env,
            start_new_session=True,  # own process group: `down` signals the whole group
        )
        log.close()
        ticks = _proc_start_ticks(proc.pid)
        entry = Entry(srv.name, comp.name, proc.pid, ticks or 0, srv.address, list(srv.argv))
        self._update(entry)
        return entry

    def _await_ready(self, srv: Server, entry: Entry) -> None:
        def check() -> None:
            if not self.is_alive(entry):
                raise StartError(
                    srv.name, "exited during start", tail(self.layout.log_file(srv.name))
                )
            srv.probe()

        try:
            wait_until(check, srv.start_timeout, interval=0.3)
        except ProbeFailed as e:
            raise StartError(
                srv.name,
                f"not ready after {srv.start_timeout:.0f}s ({e})",
                tail(self.layout.log_file(srv.name)),
            ) from e

    def start_component(
        self, comp: Component, report: Reporter, bootstrap: bool = True
    ) -> list[str]:
        """Start whatever of `comp` is not running, wait for all of it, bootstrap (unless not
        `bootstrap`: a game day that wants the servers as their state left them). Returns the
        names of servers that were started (empty when everything already ran)."""
        running = self.running()
        servers = comp.servers()
        missing = [s for s in servers if s.name not in running]
        started: list[str] = []
        if missing:
            report(comp.name, "preparing")
            comp.prepare()
            pending = []
            for srv in missing:
                report(comp.name, f"starting {srv.name}")
                pending.append((srv, self._spawn(comp, srv)))
                started.append(srv.name)
            for srv, entry in pending:
                report(comp.name, f"waiting for {srv.name} at {srv.address}")
                self._await_ready(srv, entry)
        else:
            for srv in servers:
                self._await_ready(srv, running[srv.name])
        if bootstrap:
            report(comp.name, "bootstrapping")
            comp.bootstrap()
        report(comp.name, "ready")
        return started

    def up(self, report: Reporter, only: Iterable[str] | None = None) -> list[str]:
        """Start components in dependency order, independent ones in parallel."""
        wanted = set(only) if only else set(self.components)
        done: dict[str, threading.Event] = {n: threading.Event() for n in self.components}
        failed: dict[str, BaseException] = {}
        started: list[str] = []

        def run(name: str) -> None:
            comp = self.components[name]
            try:
                for dep in comp.requires:
                    done[dep].wait()
                    if dep in failed:
                        raise StartError(name, f"not started: {dep} failed", "")
                started.extend(self.start_component(comp, report))
            except BaseException as e:  # reported to the caller below
                failed[name] = e
                report(name, "failed")
            finally:
                done[name].set()

        threads = []
        for name in self.components:
            if name not in wanted:
                done[name].set()
                continue
            t = threading.Thread(target=run, args=(name,), name=f"up-{name}", daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        if failed:
            first = next(
                (e for e in failed.values() if isinstance(e, StartError) and e.log_tail),
                next(iter(failed.values())),
            )
            raise first
        return started

    # -- stop ----------------------------------------------------------------------------
    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float | None = None) -> bool:
        """Stop one recorded server by pid (its process group); True if it was running."""
        entries = self._load()
        e = entries.get(name)
        if e is None:
            return False
        if timeout is None:
            pair = self.all_servers().get(name)
            timeout = pair[1].stop_timeout if pair else 20.0
        was_alive = self.is_alive(e)
        if was_alive:
            self._signal(e, sig)
            deadline = time.monotonic() + timeout
            while self.is_alive(e) and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.is_alive(e):
                self._signal(e, signal.SIGKILL)
                while self.is_alive(e):
                    time.sleep(0.05)
        self._update(None, remove=name)
        return was_alive

    def kill(self, name: str) -> bool:
        """SIGKILL, for failure drills: no clean shutdown."""
        return self.stop(name, signal.SIGKILL, timeout=5.0)

    @staticmethod
    def _signal(e: Entry, sig: int) -> None:
        try:
            os.killpg(e.pid, sig)  # the group leader's pid is the group id
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(e.pid, sig)

    def down(self, report: Reporter) -> list[str]:
        """Stop every recorded server, dependents first. Returns what was stopped."""
        order = list(self.components)
        entries = self._load()
        rank = {n: i for i, n in enumerate(order)}
        names = sorted(entries, key=lambda n: -rank.get(entries[n].component, len(order)))
        stopped: list[str] = []
        # servers of one component stop together (a Kafka quorum shuts down faster that way)
        by_comp: dict[str, list[str]] = {}
        for n in names:
            by_comp.setdefault(entries[n].component, []).append(n)
        for comp_name, group in by_comp.items():
            report(comp_name, "stopping")
            threads = []
            results: dict[str, bool] = {}

            def _stop(n: str, results: dict[str, bool] = results) -> None:
                results[n] = self.stop(n)

            for n in group:
                t = threading.Thread(target=_stop, args=(n,))
                t.start()
                threads.append(t)
            for t in threads:
                t.join()
            stopped.extend(n for n in group if results.get(n))
            report(comp_name, "stopped")
        return stopped

    # -- status --------------------------------------------------------------------------
    def check(self) -> dict[str, Health]:
        """One probe of every server of the stack: the only place "healthy" is decided."""
        entries = self._load()
        out: dict[str, Health] = {}
        for name, (_comp, srv) in self.all_servers().items():
            e = entries.get(name)
            if e is None or not self.is_alive(e):
                out[name] = Health(srv.address, None, "not running")
                continue
            try:
                srv.probe()
                out[name] = Health(srv.address, e.pid, None)
            except ProbeFailed as failed:
                out[name] = Health(srv.address, e.pid, str(failed))
        return out

    def status(self) -> dict[str, dict[str, object]]:
        """name -> {address, pid, healthy} for every server of the stack."""
        return {name: h.as_dict() for name, h in self.check().items()}

    def settle(
        self, names: Iterable[str], report: Reporter, interval: float = 0.5
    ) -> dict[str, dict[str, object]]:
        """Probe every server, as `status` does, until one pass finds all of `names` healthy, and
        return that pass; a running server that is not healthy is waited for up to its start
        timeout, then reported as it is. `up` prints this, never an earlier probe: a server that
        answered while `up` waited for it and stops answering a moment later (a readiness that
        flaps) is waited for again, or reported unhealthy, but not declared ready."""
        wanted = set(names)
        servers = self.all_servers()
        until: dict[str, float] = {}  # waited for since first seen not ready, each once
        unready: set[str] = set()  # reported as not ready, not seen ready since
        while True:
            health = self.check()
            now = time.monotonic()
            waiting = False
            for n in sorted(wanted & health.keys()):
                h = health[n]
                if h.waitable:
                    until.setdefault(n, now + servers[n][1].start_timeout)
                    waiting = waiting or now < until[n]
                    if n not in unready:
                        unready.add(n)
                        report(n, f"not ready now ({h.reason}); waiting")
                elif h.healthy and n in unready:
                    unready.discard(n)
                    report(n, "ready")
            if not waiting:
                for n in sorted(unready):
                    report(n, "failed")
                return {name: h.as_dict() for name, h in health.items()}
            time.sleep(interval)
