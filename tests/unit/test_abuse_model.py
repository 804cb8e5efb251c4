"""The abuse model (services/abuse): generated traffic, features that see only the past, a model
graded on held-out users, its artefacts, and `likes abuse train|evaluate|models`."""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from local import layout
from services.abuse import features, generator, model
from services.contracts import events, signals

runner = CliRunner()
COL = {name: i for i, name in enumerate(features.FEATURE_NAMES)}
SMALL = generator.Traffic(users=300, seed=3)


@pytest.fixture(scope="module")
def trained() -> model.Model:
    """`likes abuse train`'s model: the default parameters (4000 users; seeds 0-5 all reached
    the goals with missing signals and monotonic constraints, the lowest at P 0.836, R 0.692,
    AUC 0.903)."""
    return model.train(model.TrainParams())


def test_the_generator_is_deterministic_for_a_seed_and_sorted_by_time() -> None:
    likes = generator.generate(SMALL)
    assert likes == generator.generate(SMALL)
    assert likes != generator.generate(generator.Traffic(users=300, seed=4))
    assert [o.ts for o in likes] == sorted(o.ts for o in likes)
    bots = {o.user_id for o in likes if o.bot}
    assert bots and {o.user_id for o in likes} - bots  # both classes, no account in both
    assert not bots & {o.user_id for o in likes if not o.bot}
    for o in likes:  # what the write path would have accepted (services/contracts/signals.py)
        assert signals.parse(o.client_ip, o.device, o.account_created) is not None
        if o.client_ip is not None:  # some send none (generator.MISSING_IP)
            assert isinstance(ipaddress.ip_address(o.client_ip), ipaddress.IPv4Address)
        assert o.account_created is not None and o.account_created <= o.ts


def test_bots_burst_share_devices_and_are_young_more_than_humans() -> None:
    """The generated classes differ the way the docstring says, and overlap: neither extreme
    alone separates them (else the model's grade would mean nothing)."""
    likes = generator.generate(generator.Traffic(users=1500, seed=1))
    ds = model.featurize(likes)
    bot, human = ds.X[ds.y], ds.X[~ds.y]
    for col in ("likes_10s", "device_users_1h", "ip_in_subnet_entropy", "subnet_users_1h"):
        assert np.nanmean(bot[:, COL[col]]) > np.nanmean(human[:, COL[col]]), col
    assert np.nanmedian(bot[:, COL["account_age_s"]]) < np.nanmedian(human[:, COL["account_age_s"]])
    assert np.mean(human[:, COL["likes_10s"]] >= 3) > 0.005  # some humans burst
    assert np.mean(bot[:, COL["likes_10s"]] <= 1) > 0.2  # many bot likes are slow
    assert np.mean(bot[:, COL["account_age_s"]] > 30 * 86400) > 0.1  # bought, old accounts


def test_a_row_depends_only_on_the_likes_before_it() -> None:
    likes = generator.generate(SMALL)
    k = len(likes) // 2
    whole = model.featurize(likes).X
    prefix = model.featurize(likes[:k]).X
    np.testing.assert_array_equal(whole[:k], prefix)  # NaN equals NaN here
    # a different future (a ring reusing an early like's device and /24) changes nothing before it
    o = likes[k - 1]
    future = [features.Observation(f"ring-{i}", "p1", o.ts + 1 + i, o.client_ip, o.device,
                                   o.ts, bot=True) for i in range(50)]  # fmt: skip
    np.testing.assert_array_equal(model.featurize(likes[:k] + future).X[:k], prefix)
    assert model.featurize(likes[:k] + future).X[-1][COL["device_users_1h"]] > 1


def _obs(user: str, ts: float, ip: str | None = "10.1.2.3", device: str | None = "d1",
         created: float | None = 0.0) -> features.Observation:  # fmt: skip
    return features.Observation(user, "p", ts, ip, device, created)


def test_features_count_windows_entropy_and_sharing() -> None:
    f = features.Features()
    rows = [f.observe(_obs("a", 1000.0 + i, ip=f"10.1.2.{i + 1}")) for i in range(8)]
    last = rows[-1]
    assert last[COL["likes_10s"]] == 8 and last[COL["likes_1h"]] == 8
    assert last[COL["since_previous_s"]] == 1.0
    assert rows[0][COL["since_previous_s"]] == features.HORIZON_S
    assert last[COL["subnet_entropy"]] == 0.0  # one /24 ...
    assert last[COL["ip_in_subnet_entropy"]] == pytest.approx(3.0)  # ... 8 hosts in it: 3 bits
    assert last[COL["account_age_s"]] == 1007.0
    row = f.observe(_obs("b", 1010.0, ip="10.1.2.200"))
    assert row[COL["subnet_users_1h"]] == 2 and row[COL["ip_users_1h"]] == 1
    assert row[COL["device_users_1h"]] == 2 and row[COL["subnet_likes_60s"]] == 9
    assert row[COL["likes_10s"]] == 1  # b's own pace


def test_features_expire_after_the_horizon_and_memory_is_bounded() -> None:
    f = features.Features(max_keys=20)
    for i in range(100):
        f.observe(_obs(f"u{i}", 1000.0 + i, ip=f"10.0.{i}.1", device=f"d{i}"))
    assert all(n <= 20 for n in f.keys().values())
    later = 1000.0 + 100 + features.HORIZON_S
    row = f.observe(_obs("u99", later, ip="10.0.99.1", device="d99"))
    assert row[COL["likes_1h"]] == 1 and row[COL["since_previous_s"]] == features.HORIZON_S
    assert row[COL["subnet_users_1h"]] == 1 and row[COL["device_users_1h"]] == 1
    assert f.keys() == {"users": 1, "subnets": 1, "ips": 1, "devices": 1}  # the rest expired
    for i in range(features.MAX_EVENTS + 500):  # a very fast user: counts saturate, not grow
        row = f.observe(_obs("fast", later + 1 + i / 1000))
    assert row[COL["likes_1h"]] == features.MAX_EVENTS


def _event(**signals_: object) -> events.LikeEvent:
    return events.LikeEvent(
        event_id="e", intent_uuid="i", user_id="u", post_id="p", action="like", reaction="like",
        delta=1, region="r", shard=0, occurred_at=5_000_000, **signals_,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_like_event_gives_the_same_row_and_missing_signals_are_nan() -> None:
    e = _event(client_ip="10.0.0.1", device="d1", account_created=1_000_000)
    assert features.Features().observe(e) == features.Features().observe(
        features.Observation("u", "p", 5000.0, "10.0.0.1", "d1", 1000.0)
    )
    row = features.Features().observe(_event())  # written before the signals
    unknown = {n for n, v in zip(features.FEATURE_NAMES, row, strict=True) if math.isnan(v)}
    assert unknown == {"subnet_entropy", "ip_in_subnet_entropy", "subnet_users_1h", "ip_users_1h",
                       "subnet_likes_60s", "device_users_1h", "account_age_s"}  # fmt: skip
    assert row[COL["likes_1h"]] == 1  # the pace needs no signal


def test_the_split_is_by_user_and_keeps_the_classes() -> None:
    params = model.TrainParams(traffic=SMALL)
    parts = model.split(model.featurize(generator.generate(SMALL)), params)
    users = {name: set(ds.users.tolist()) for name, ds in parts.items()}
    assert not users["train"] & users["validation"]
    assert not users["train"] & users["held_out"]
    assert not users["validation"] & users["held_out"]
    for ds in parts.values():
        assert 0 < ds.y.sum() < len(ds)


def test_the_threshold_keeps_precision_with_confidence_over_users() -> None:
    """40 users with 10 likes each, scored user by user; the humans among the lower scores. The
    point precision reaches 0.8 only with every like flagged; the bound stops earlier."""
    labels = [i not in (15, 25, 30, 33, 35, 36, 38, 39) for i in range(40)]
    users = np.repeat([f"u{i}" for i in range(40)], 10)
    y = np.repeat(labels, 10)
    p = np.repeat(np.linspace(0.99, 0.01, 40), 10)
    scores, precision, lower, recall = model.precision_bounds(y, p, users)
    assert list(scores) == sorted(scores, reverse=True) and recall[-1] == 1.0
    assert np.all(lower <= precision)
    assert lower[0] == -math.inf  # one user, all bots: no evidence about the next
    assert 0.4 < lower[1] < 0.5  # two such users: Wilson's bound, 2 / (2 + z^2)
    t = model.choose_threshold(y, p, users, 0.8)
    at = list(scores).index(t)
    assert precision[np.flatnonzero(precision >= 0.8)[-1]] == 0.8  # the point rule: flag all
    assert t > 0.1 and precision[at] > 0.9 and recall[at] > 0.9  # the bound's choice
    assert lower[at] >= 0.8 and lower[at + 1] < 0.8  # the lowest that keeps the bound
    with pytest.raises(model.NoThreshold, match=r"precision 0\.99"):
        model.choose_threshold(y, p, users, 0.99)


def test_a_trained_model_reaches_the_goals_on_held_out_users(trained: model.Model) -> None:
    held = trained.meta["held_out"]
    assert held["roc_auc"] >= model.GOALS.roc_auc, held
    assert held["precision"] >= model.GOALS.precision, held
    assert held["recall"] >= model.GOALS.recall, held
    assert model.shortfalls(model.Evaluation.from_json(held)) == []  # the gate lets it through
    assert held["threshold"] == trained.threshold
    # the errors as counts of likes, which the rates are made of: a human's like voided (false
    # positive), a bot's left counted (false negative)
    caught = held["bots"] - held["false_negatives"]
    assert held["recall"] == pytest.approx(caught / held["bots"], abs=1e-4)
    assert held["precision"] == pytest.approx(caught / (caught + held["false_positives"]), abs=1e-4)
    assert held["false_positives"] > 0 and held["false_negatives"] > 0  # a model, not an oracle
    assert trained.threshold >= trained.params.min_score == 0.5  # more likely a bot than not
    assert trained.meta["sizes"]["held_out"]["users"] == pytest.approx(800, abs=10)
    cal = held["calibration"]
    assert sum(b["count"] for b in cal) == held["rows"]
    top = cal[-1]  # what it is sure about, it is right about
    assert top["low"] == 0.9 and top["observed"] >= 0.9


def test_an_old_account_liking_a_few_posts_at_once_is_not_voided(trained: model.Model) -> None:
    """What the suite's and the demo's users do (accounts 2 to 7 years old, 2 to 5 likes within
    a second or so, with their own address or none, no device): a person scrolling. The model
    before the monotonic constraints voided such likes at some ages (0.25-1.0 at 850-1050 days,
    0.02 at 4 years), and CI's data-path tests lost likes to it."""
    now, worst = 1_800_000_000.0, []
    for age_days in range(700, 2700, 50):
        for n, gap in ((2, 0.05), (3, 0.3), (5, 0.2), (5, 1.0)):
            for ip in (None, "10.3.3.3"):
                f, created = features.Features(), now - age_days * 86400.0
                obs = [features.Observation("u", f"p{i}", now + i * gap, ip, None, created)
                       for i in range(n)]  # fmt: skip
                rows = [f.observe(o) for o in obs]
                worst.append((float(trained.probabilities(rows).max()), age_days, n, gap, ip))
    top = max(worst, key=lambda w: w[0])
    assert top[0] < trained.threshold, top


def test_older_accounts_and_a_slower_pace_never_raise_the_score(trained: model.Model) -> None:
    """The monotonic constraints (model.MONOTONIC) hold on the fitted, calibrated model."""
    rng = np.random.default_rng(0)
    X = model.featurize(generator.generate(SMALL)).X
    base = X[rng.choice(len(X), 300, replace=False)]
    for name, sign in (("account_age_s", -1), ("since_previous_s", -1), ("likes_60s", 1)):
        lo, hi = base.copy(), base.copy()
        lo[:, COL[name]] = np.nan_to_num(lo[:, COL[name]], nan=0.0)
        hi[:, COL[name]] = lo[:, COL[name]] * 2 + 1
        d = trained.probabilities(hi) - trained.probabilities(lo)
        assert (d * sign >= -1e-9).all(), (name, d.min() if sign > 0 else d.max())


def test_missing_signals_are_as_common_among_humans_as_among_bots() -> None:
    """So that "no device" or "no address" is never learnt as evidence either way."""
    obs = generator.generate(generator.Traffic(users=2000, seed=1))
    for attr, odds in (("client_ip", generator.MISSING_IP), ("device", generator.MISSING_DEVICE)):
        share = {}
        for bot in (False, True):
            users = {o.user_id for o in obs if o.bot is bot}
            missing = {o.user_id for o in obs if o.bot is bot and getattr(o, attr) is None}
            share[bot] = len(missing) / len(users)
        assert share[False] == pytest.approx(odds, abs=0.03), (attr, share)
        assert share[True] == pytest.approx(odds, abs=0.05), (attr, share)


def test_save_and_load_keep_the_predictions(trained: model.Model, tmp_path: Path) -> None:
    rows = model.featurize(generator.generate(SMALL)).X
    path = model.save(trained, tmp_path)
    assert path == tmp_path / trained.version
    assert model.current_version(tmp_path) == trained.version
    loaded = model.load(tmp_path)
    assert loaded.version == trained.version and loaded.threshold == trained.threshold
    np.testing.assert_array_equal(loaded.probabilities(rows), trained.probabilities(rows))
    assert [v["version"] for v in model.versions(tmp_path)] == [trained.version]
    with pytest.raises(model.NoModel, match="no abuse model v0"):
        model.load(tmp_path, "v0")
    with pytest.raises(ValueError, match="12 columns"):
        loaded.probabilities([[1.0, 2.0]])
    meta = json.loads((path / model.META_FILE).read_text())
    (path / model.META_FILE).write_text(json.dumps({**meta, "feature_names": ["likes_10s"]}))
    with pytest.raises(model.IncompatibleModel, match="retrain"):
        model.load(tmp_path)


def test_train_then_evaluate_and_models_on_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIKES_HOME", str(tmp_path))  # the default directory follows the stack home
    r = runner.invoke(app, ["abuse", "train", "--users", "600", "--seed", "0", "--json"])
    assert r.exit_code == 0, r.output
    trained = json.loads(r.stdout)
    assert re.fullmatch(r"v\d{8}T\d{6}Z-[0-9a-f]{8}", trained["version"])
    # gated by default, and it meets the goals: published
    assert trained["published"] is True and trained["shortfalls"] == [], trained
    assert trained["current"] == trained["version"]
    assert Path(trained["path"]).parent == layout.Layout(tmp_path, layout.Ports()).abuse_models
    r = runner.invoke(app, ["abuse", "evaluate", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert {"precision", "recall", "roc_auc", "threshold", "version", "calibration"} <= set(out)
    # the saved model, graded on its held-out users generated again, as when it was trained
    assert out["version"] == trained["version"]
    keys = ("precision", "recall", "roc_auc", "threshold", "rows", "bots", "calibration",
            "false_positives", "false_negatives")  # fmt: skip
    assert {k: out[k] for k in keys} == {k: trained[k] for k in keys}
    r = runner.invoke(app, ["abuse", "evaluate"])
    assert r.exit_code == 0 and "calibration" in r.stdout, r.output
    assert "FP" in r.stdout and "FN" in r.stdout, r.output
    r = runner.invoke(app, ["abuse", "models", "--json"])
    listed = json.loads(r.stdout)
    assert listed["current"] == trained["version"]
    assert [v["current"] for v in listed["versions"]] == [True]


# Too few users for the goals: a threshold is found (precision holds) but the held-out recall
# falls short (0.36 < 0.6 when written). Real training, not a mocked grade.
WEAK = ["--users", "200", "--seed", "0"]


def test_a_version_below_the_goals_is_saved_but_never_made_current(
    trained: model.Model, tmp_path: Path
) -> None:
    """The publishing gate (issue 13): the servers keep serving the previous version."""
    before = model.save(copy.deepcopy(trained), tmp_path).name
    r = runner.invoke(app, ["abuse", "train", *WEAK, "--gate", "--model-dir", str(tmp_path),
                            "--json"])  # fmt: skip
    assert r.exit_code == 1, r.output
    out = json.loads(r.stdout)
    assert out["published"] is False and out["current"] == before
    assert model.current_version(tmp_path) == before  # untouched
    assert model.load(tmp_path).version == before
    # saved all the same, for a look (`abuse evaluate --version`) or a deliberate `abuse use`
    assert (tmp_path / out["version"] / model.META_FILE).is_file()
    assert [v["version"] for v in model.versions(tmp_path)] == [before, out["version"]]
    # the grades, and which goal each shortfall misses, by name and value
    assert out["goals"] == dataclasses.asdict(model.GOALS)
    misses = {x["figure"]: x for x in out["shortfalls"]}
    assert misses, out
    for figure, miss in misses.items():
        assert miss["value"] == out[figure] < miss["goal"] == getattr(model.GOALS, figure)
    assert "recall" in misses  # what this training set lacks (the others are met)
    assert {"precision", "recall", "roc_auc", "threshold", "version", "sizes"} <= set(out)
    # for people: the figure and its value, and that nothing changed
    r = runner.invoke(app, ["abuse", "train", *WEAK, "--model-dir", str(tmp_path)])
    assert r.exit_code == 1, r.output
    assert f"recall {misses['recall']['value']:g} is below its goal" in r.output
    assert f"current stays {before}" in r.output and "NOT made current" in r.output
    assert model.current_version(tmp_path) == before


def test_no_gate_publishes_a_version_below_the_goals_and_says_so(tmp_path: Path) -> None:
    r = runner.invoke(app, ["abuse", "train", *WEAK, "--no-gate", "--model-dir", str(tmp_path),
                            "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["published"] is True and out["shortfalls"], out
    assert model.current_version(tmp_path) == out["version"]
    assert "published without the gate: held-out recall" in r.stderr


def test_the_gate_names_every_goal_missed_and_a_missing_grade() -> None:
    held = model.Evaluation(precision=0.79, recall=0.6, roc_auc=math.nan, threshold=0.5,
                            rows=10, bots=10, calibration=())  # fmt: skip
    misses = model.shortfalls(held)
    assert [(x.figure, x.goal) for x in misses] == [
        ("roc_auc", model.GOALS.roc_auc),
        ("precision", model.GOALS.precision),
    ]  # recall at its goal passes; no ROC AUC (one class only) fails
    assert str(misses[1]) == f"precision 0.79 is below its goal {model.GOALS.precision:g}"
    # the goals are an argument: a grade that meets these, but a stricter recall goal
    graded = dataclasses.replace(held, precision=0.9, roc_auc=0.95)
    assert model.shortfalls(graded) == []
    assert [x.figure for x in model.shortfalls(graded, model.Goals(recall=0.61))] == ["recall"]


def test_evaluate_without_a_model_exits_2_naming_the_problem(tmp_path: Path) -> None:
    r = runner.invoke(app, ["abuse", "evaluate", "--model-dir", str(tmp_path)])
    assert r.exit_code == 2
    assert "no current abuse model" in r.output and str(tmp_path) in r.output
    assert "Traceback" not in r.output
    r = runner.invoke(app, ["abuse", "evaluate", "--model-dir", str(tmp_path), "--version", "v1"])
    assert r.exit_code == 2 and "no abuse model v1" in r.output


def test_use_switches_the_current_version_and_refuses_an_unknown_one(
    trained: model.Model, tmp_path: Path
) -> None:
    # the rollback of a bad deploy: serve the previous version again
    first = model.save(copy.deepcopy(trained), tmp_path).name
    # saved again: a new version (save never overwrites one), now current
    second = model.save(copy.deepcopy(trained), tmp_path).name
    assert model.current_version(tmp_path) == second != first
    r = runner.invoke(app, ["abuse", "use", first, "--model-dir", str(tmp_path), "--yes", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"current": first, "before": second}
    assert model.current_version(tmp_path) == first and model.load(tmp_path).version == first
    r = runner.invoke(app, ["abuse", "use", "v0-nope", "--model-dir", str(tmp_path), "--yes"])
    assert r.exit_code == 2 and "no abuse model v0-nope" in r.output and first in r.output
    assert model.current_version(tmp_path) == first  # unchanged
