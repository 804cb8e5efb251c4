"""`likes local up` and `likes local status` agree: `up` reports its last probe of every server,
the one `status` makes, not a probe from a moment before. The server is a real process (`sleep`)
whose readiness answers follow a script, so the supervisor's logic runs without any store.

Prevents: a CI run where `up` waited for the aggregator, saw it ready, then printed a status in
which it was not (its readiness had flipped in between) and exited 1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from local import cli, layout, supervisor
from local.components.base import Component, ProbeFailed, Server


class Scripted(Component):
    """One `sleep` process; its probe answers `answers` in turn, then `then` for ever."""

    name = "scripted"

    def __init__(self, lay: layout.Layout, answers: list[bool], then: bool) -> None:
        super().__init__(lay)
        self.answers = list(answers)
        self.then = then

    def probe(self) -> None:
        ok = self.answers.pop(0) if self.answers else self.then
        if not ok:
            raise ProbeFailed("scripted: HTTP 503")

    def servers(self) -> list[Server]:
        return [
            Server(
                name="scripted",
                argv=["sleep", "300"],
                address="scripted:1",
                probe=self.probe,
                start_timeout=1.0,
                stop_timeout=2.0,
            )
        ]


@pytest.fixture
def lay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> layout.Layout:
    monkeypatch.setenv("LIKES_HOME", str(tmp_path))
    return layout.Layout(home=tmp_path, ports=layout.Ports(0), kafka_brokers=1)


@pytest.fixture
def stack(lay: layout.Layout, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Scripted]]:
    """`likes local` on a stack of the Scripted components a test appends (stopped after)."""
    comps: list[Scripted] = []
    monkeypatch.setattr(cli, "_supervisor", lambda *_, **__: supervisor.Supervisor(lay, comps))
    yield comps
    supervisor.Supervisor(lay, comps).down(lambda *_: None)


def invoke(*args: str) -> tuple[int, str, dict[str, dict[str, object]]]:
    result = CliRunner().invoke(cli.app, list(args))
    return result.exit_code, result.output, json.loads(result.stdout.splitlines()[-1])


def test_a_server_that_flips_after_up_waited_for_it_is_waited_for_again(
    stack: list[Scripted], lay: layout.Layout
) -> None:
    # ready when `up` waits for it, not ready at the next probe, ready again after
    stack.append(Scripted(lay, [True, False], then=True))
    code, output, up = invoke("up", "--json")
    assert code == 0, output
    assert up["scripted"]["healthy"] is True
    # the flap is shown, not hidden
    assert "scripted: not ready now (scripted: HTTP 503); waiting" in output
    _, _, status = invoke("status", "--json")
    assert status == up


def test_a_server_that_stays_unready_after_up_waited_for_it_is_reported(
    stack: list[Scripted], lay: layout.Layout
) -> None:
    stack.append(Scripted(lay, [True], then=False))
    code, output, up = invoke("up", "--json")
    assert code == 1, output
    assert up["scripted"]["healthy"] is False and up["scripted"]["pid"]
    assert "scripted: failed" in output
    _, _, status = invoke("status", "--json")
    assert status == up


def test_a_second_up_waits_for_a_running_server_like_the_first(
    stack: list[Scripted], lay: layout.Layout
) -> None:
    stack.append(Scripted(lay, [], then=True))
    assert invoke("up", "--json")[0] == 0
    # already running: `up` starts nothing, and still reports what a probe says now
    stack[0].answers = [True, False, False]
    code, output, up = invoke("up", "--json")
    assert code == 0, output
    assert up["scripted"]["healthy"] is True
    assert "not ready now" in output


def test_the_default_and_test_stacks_share_no_port() -> None:
    # The default stack (offset 0), the test session's (1000) and test_gateway's own gateway (7000)
    # run side by side on a developer's machine; a shared port makes one fail to start or, worse,
    # answer for the other (offset 1000 once put count-cache-1 on the default gateway's admin port).
    offsets = [0, 1000, 7000]
    for i, a in enumerate(offsets):
        for b in offsets[i + 1 :]:
            shared = layout.Ports(a).every() & layout.Ports(b).every()
            assert not shared, f"offsets {a} and {b} share ports {sorted(shared)}"
    assert layout.Ports(0).cassandra_jmx in layout.Ports(0).every()
