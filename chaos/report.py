"""A game day's report: per experiment, the fault, the clients' timeline (write and read success
and p99 latency, the fault shaded), how far the counts were off while they converged, the alerts
delivered and their runbooks, and the verdict. Markdown (report.md, plots as SVG files beside
it) and HTML (report.html, the same plots inline: one file to attach to a postmortem)."""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaos import catalog
from chaos.runner import Result


def plot(result: Result) -> str:
    """The experiment's timeline as an SVG document ("" when it ran no traffic)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = result.checks
    rows: list[dict[str, float]] = c.get("timeline") or []
    if not rows:
        return ""
    fig, (ok_ax, lat_ax, drift_ax) = plt.subplots(3, 1, figsize=(8, 6.5), sharex=True)
    t = [r["t"] for r in rows]
    for kind, colour in (("write", "tab:blue"), ("read", "tab:green")):
        ok_ax.plot(t, [r.get(f"{kind}_ok") for r in rows], label=f"{kind}s answered OK",
                   color=colour)  # fmt: skip
        lat_ax.plot(t, [r.get(f"{kind}_p99_ms") for r in rows], label=f"{kind} p99",
                    color=colour)  # fmt: skip
    ok_ax.set_ylim(-0.05, 1.05)
    ok_ax.set_ylabel("share OK")
    lat_ax.set_ylabel("ms")
    lat_ax.set_yscale("log")
    drift = c.get("drift") or []
    if drift:
        drift_ax.step([d[0] for d in drift], [d[1] for d in drift], where="post",
                      color="tab:red", label="likes the counts are off by")  # fmt: skip
    drift_ax.set_ylabel("likes off")
    drift_ax.set_xlabel("seconds since the traffic started")
    marks = [(float(m[0]), str(m[1])) for m in c.get("marks") or []]
    faults = [m for m in marks if not m[1].startswith(("restart", "recovered", "resume"))]
    ends = [m for m in marks if m[1].startswith(("recovered", "resume"))]
    for ax in (ok_ax, lat_ax, drift_ax):
        if faults:
            end = ends[-1][0] if ends else t[-1]
            ax.axvspan(faults[0][0], end, color="tab:orange", alpha=0.15, label="fault")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower left", fontsize=7)
    fig.suptitle(f"{result.id}: {result.verdict}")
    fig.tight_layout()
    out = io.StringIO()
    fig.savefig(out, format="svg")
    plt.close(fig)
    return out.getvalue()


OK_SHARE = 0.99  # a second whose answers were at least this share OK counts as healthy


def timings(result: Result) -> dict[str, float | None]:
    """What a reader of a postmortem asks first, from the timeline (one row per second):
    - `writes_degraded_s` / `reads_degraded_s`: seconds whose answers were under 99 % OK
      (a 429 or a clean 503 is a correct answer, not an OK one);
    - `writes_back_after_s`: from the end of the fault (the first restart or resume) to the
      first healthy second of writes after it (0 when writes never suffered);
    - `stale_for_s`: once the traffic stopped, how long the counts took to equal the truth.
    None where the run has no such data."""
    c = result.checks
    rows: list[dict[str, float]] = c.get("timeline") or []
    marks = [(float(m[0]), str(m[1])) for m in c.get("marks") or []]
    ends = [t for t, what in marks if what.startswith(("restart", "resume"))]

    def degraded(kind: str) -> float | None:
        shares = [r.get(f"{kind}_ok") for r in rows]
        seen = [x for x in shares if x is not None]
        return float(sum(x < OK_SHARE for x in seen)) if seen else None

    back: float | None = None
    if rows and ends:
        after = [r for r in rows if r["t"] >= ends[0] and r.get("write_ok") is not None]
        healthy = [r["t"] for r in after if r["write_ok"] >= OK_SHARE]
        suffered = any(r.get("write_ok", 1.0) < OK_SHARE for r in rows)
        if not suffered:
            back = 0.0
        elif healthy:
            back = round(max(0.0, healthy[0] - ends[0]), 1)
    first_match = (c.get("convergence") or {}).get("first_match_s")
    return {
        "writes_degraded_s": degraded("write"),
        "reads_degraded_s": degraded("read"),
        "writes_back_after_s": back,
        "stale_for_s": None if first_match is None else round(float(first_match), 1),
    }


def _seconds(v: float | None) -> str:
    return "-" if v is None else f"{v:g} s"


def _alerts(result: Result) -> list[tuple[str, str, str, str]]:
    """(alert, fired, resolved, runbook) rows."""
    out = []
    for name, a in sorted((result.checks.get("alerts") or {}).items()):
        fired = "-" if a.get("fired_s") is None else f"+{a['fired_s']} s"
        if a.get("carried_over"):  # firing since before the run: not this fault's to claim
            fired += " (carried over)"
        resolved = "-" if a.get("resolved_s") is None else f"+{a['resolved_s']} s"
        out.append((name, fired, resolved, f"runbooks/{_slug(name)}.md"))
    return out


def _slug(alert: str) -> str:
    """The runbook that answers the alert (its front matter names it), as the on-call finds it."""
    from cli import runbook

    try:
        return runbook.for_alert(alert).slug
    except runbook.RunbookError:
        return "(none)"


def write(results: Sequence[Result], out_dir: Path) -> tuple[Path, Path]:
    """report.md (+ plots/<id>.svg) and report.html in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "plots").mkdir(exist_ok=True)
    md: list[str] = ["# Game day report", ""]
    page: list[str] = ["<h1>Game day report</h1>"]
    passed = sum(r.verdict == "passed" for r in results)
    head = f"{passed} of {len(results)} experiments passed."
    cols = ["experiment", "verdict", "duration", "writes degraded", "writes back after",
            "stale after traffic", "failed activities"]  # fmt: skip
    md += [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    page += [f"<p>{head}</p>", "<table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"]
    for r in results:
        failed = ", ".join(r.failed_activities) or "-"
        tm = timings(r)
        cells = [
            r.verdict,
            f"{r.duration_s} s",
            *(_seconds(tm[k]) for k in ("writes_degraded_s", "writes_back_after_s", "stale_for_s")),
            failed,
        ]
        md.append(f"| [{r.id}](#{r.id}) | " + " | ".join(cells) + " |")
        page.append(f"<tr><td><a href='#{r.id}'>{r.id}</a></td>"
                    + "".join(f"<td>{html.escape(x)}</td>" for x in cells) + "</tr>")  # fmt: skip
    page.append("</table>")
    for r in results:
        svg = plot(r)  # drawn once, for both documents
        md += _section_md(r, out_dir, svg)
        page += _section_html(r, svg)
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    md_path.write_text("\n".join(md) + "\n")
    html_path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>Game day report</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:auto}td,th{padding:2px 8px;"
        "border-bottom:1px solid #ddd;text-align:left}</style></head><body>"
        + "\n".join(page)
        + "</body></html>\n"
    )
    return md_path, html_path


def _describe(r: Result) -> tuple[str, str]:
    try:
        m = catalog.mode(r.id)
        return m.seed, m.fidelity or ""
    except KeyError:
        return "", ""


def _facts(r: Result) -> list[tuple[str, str]]:
    c = r.checks
    sent = c.get("traffic") or {}
    facts = [(name, "held" if ok else "VIOLATED") for name, ok in (c.get("checks") or {}).items()]
    if sent:
        facts += [
            ("likes sent / accepted", f"{sent.get('likes_sent')} / {sent.get('likes_accepted')}"),
            ("write answers", str(sent.get("writes"))),
            ("read answers", str(sent.get("reads"))),
        ]
    if c.get("convergence"):
        facts.append(("convergence", str(c["convergence"].get("said"))))
    for t, what in c.get("marks") or []:
        facts.append((f"at +{t} s", what))
    return facts


def _section_md(r: Result, out_dir: Path, svg: str) -> list[str]:
    seed, fidelity = _describe(r)
    lines = ["", f"## {r.id}", "", f"**{r.verdict}** in {r.duration_s} s. {seed}", ""]
    if fidelity:
        lines += [f"Fidelity: {fidelity}", ""]
    if svg:
        (out_dir / "plots" / f"{r.id}.svg").write_text(svg)
        lines += [f"![{r.id} timeline](plots/{r.id}.svg)", ""]
    lines += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in _facts(r)]
    alerts = _alerts(r)
    if alerts:
        lines += ["", "| alert | fired | resolved | runbook |", "|---|---|---|---|"]
        lines += [f"| {a} | {f} | {s} | [{b}](../../{b}) |" for a, f, s, b in alerts]
    if r.journal:
        lines += ["", f"Journal: `{r.journal}`"]
    return lines


def _section_html(r: Result, svg: str) -> list[str]:
    seed, fidelity = _describe(r)
    out = [f"<h2 id='{r.id}'>{r.id}</h2>",
           f"<p><b>{r.verdict}</b> in {r.duration_s} s. {html.escape(seed)}</p>"]  # fmt: skip
    if fidelity:
        out.append(f"<p>Fidelity: {html.escape(fidelity)}</p>")
    if svg:
        out.append(svg[svg.index("<svg") :])
    out.append("<table>" + "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                                   for k, v in _facts(r)) + "</table>")  # fmt: skip
    alerts = _alerts(r)
    if alerts:
        out.append("<table><tr><th>alert</th><th>fired</th><th>resolved</th><th>runbook</th></tr>"
                   + "".join(f"<tr><td>{a}</td><td>{f}</td><td>{s}</td><td>{b}</td></tr>"
                             for a, f, s, b in alerts) + "</table>")  # fmt: skip
    return out


def summary(results: Sequence[Result]) -> dict[str, Any]:
    rows = [
        {"id": r.id, "verdict": r.verdict, "duration_s": r.duration_s, **timings(r)}
        for r in results
    ]
    return {"passed": sum(r.verdict == "passed" for r in results), "experiments": rows}
