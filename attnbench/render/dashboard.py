"""The history as a static site: ``attnbench history publish OUT/``.

``index.html`` lists every change point (its case, metric, size, confidence and the commits on
either side) and links one page per layer; each layer page plots every series of the layer
over its commits, the steps drawn as dashed lines where the data put them, with a table of the
commits below. The charts are SVG inside the pages and nothing is fetched: the site opens
from disk, with no server and no script.
"""

from __future__ import annotations

import html
import io
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.errors import AttnbenchError
from attnbench.results.history import SERIES_KEYS, slug
from attnbench.storage import write_text_atomic
from attnbench.units import fmt_seconds

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 70em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 90%; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }
.slower { color: #b00; } .faster { color: #070; }
figure { margin: 1.5em 0; } code { font-size: 95%; }
"""


def series_id(row: Mapping[str, Any]) -> str:
    """A series' id in the pages (an HTML id and the charts' group ids)."""
    threads = row.get("threads")  # an entry that names no count keeps the id it had
    if isinstance(threads, float):  # a column with gaps holds floats
        threads = None if math.isnan(threads) else int(threads)
    on = "" if threads is None else f"-t{threads}"
    return slug(f"{row['machine']}-{row['device_name']}-{row['dtype']}{on}-{row['case_id']}")


def commit_link(commit: str, url: str | None) -> str:
    short = html.escape(commit[:10])
    return f'<a href="{html.escape(url.format(commit=commit))}">{short}</a>' if url else short


def _page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>\n"
        f"<body>\n<h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n"
    )


def chart(commits: list[str], times: list[float], steps: list[int], ident: str) -> str:
    """One series over its commits as inline SVG: each commit a point, each step a dashed
    line between the last commit before it and the first after (group id
    ``step-<ident>-<index>``); the axes' group id is ``axes-<ident>``, their plotting area's
    ``area-<ident>``."""
    from matplotlib import rc_context  # lazy: the command line starts without matplotlib
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.5, 2.6), dpi=100)
    ax = figure.add_subplot()
    ax.set_gid(f"axes-{ident}")
    ax.patch.set_gid(f"area-{ident}")  # the plotting area alone: commits -0.5 .. count - 0.5
    x = list(range(len(times)))
    ax.plot(x, times, marker="o", markersize=3, linewidth=0.8, color="#1f5fa8")
    for index in steps:
        line = ax.axvline(index - 0.5, color="#c0392b", linestyle="--", linewidth=1.2)
        line.set_gid(f"step-{ident}-{index}")
    ax.set_xlim(-0.5, len(times) - 0.5)
    ax.set_yscale("log")
    ax.set_xlabel("commit (oldest first)")
    ax.set_ylabel("time per call [s]")
    ticks = x[:: max(1, len(x) // 8)]
    ax.set_xticks(ticks, [commits[i][:7] for i in ticks], fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    buffer = io.StringIO()
    with rc_context({"svg.hashsalt": ident}):  # the SVG's ids: the same for the same chart
        figure.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def publish(
    frame: pd.DataFrame, steps: pd.DataFrame, out: Path, *, commit_url: str | None = None
) -> list[Path]:
    """Write the site for a history (``load_history``) and its steps (``history_steps``)
    into ``out``; the pages written."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AttnbenchError(f"cannot write the site to {str(out)!r}: {exc}") from None
    written = []
    layers = sorted(frame["layer"].unique())
    for layer in layers:
        path = out / f"layer-{slug(layer)}.html"
        write_text_atomic(path, _layer_page(layer, frame, steps, commit_url))
        written.append(path)
    index = out / "index.html"
    write_text_atomic(index, _index(frame, steps, layers, commit_url))
    return [index, *written]


def _index(frame: pd.DataFrame, steps: pd.DataFrame, layers: list[str], url: str | None) -> str:
    runs = frame.drop_duplicates("file")
    parts = [
        f"<p>{len(runs)} run(s) of {frame['commit'].nunique()} commit(s) on "
        f"{frame['machine'].nunique()} machine(s); each layer's page plots its series.</p>",
        "<ul>"
        + "".join(
            f'<li><a href="layer-{slug(layer)}.html">{html.escape(layer)}</a></li>'
            for layer in layers
        )
        + "</ul>",
        "<h2>Change points</h2>",
    ]
    if steps.empty:
        parts.append("<p>None found.</p>")
    else:
        parts.append(_steps_table(steps, url, link_pages=True))
    return _page("attnbench: performance over commits", "\n".join(parts))


def _steps_table(steps: pd.DataFrame, url: str | None, *, link_pages: bool) -> str:
    head = (
        "<tr><th>layer</th><th>case</th><th>metric</th><th>change</th><th>p</th>"
        "<th>last before</th><th>first after</th><th>machine</th></tr>"
    )
    rows = []
    for s in steps.to_dict(orient="records"):
        cls = "slower" if s["ratio"] > 1 else "faster"
        layer = html.escape(str(s["layer"]))
        if link_pages:
            layer = f'<a href="layer-{slug(str(s["layer"]))}.html#{series_id(s)}">{layer}</a>'
        rows.append(
            f"<tr><td>{layer}</td><td>n={s['n']} d={s['d']}</td><td>{s['metric']}</td>"
            f'<td class="{cls}">x{s["ratio"]:.3f}</td><td>{s["p_value"]:.2g}</td>'
            f"<td>{commit_link(s['before'], url)}</td><td>{commit_link(s['after'], url)}</td>"
            f"<td>{html.escape(str(s['machine']))}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def _layer_page(layer: str, frame: pd.DataFrame, steps: pd.DataFrame, url: str | None) -> str:
    mine = frame[frame["layer"] == layer]
    keys = ["machine", *SERIES_KEYS, "case_id"]
    parts = ['<p><a href="index.html">all layers and change points</a></p>']
    for key, group in mine.groupby(keys, sort=True, dropna=False):
        row = dict(zip(keys, key, strict=True))
        ident = series_id(row)
        per_commit = (
            group.groupby("commit", sort=False)
            .agg(
                order=("order", "first"), time_s=("time_s", "median"), subject=("subject", "first")
            )
            .sort_values("order", kind="stable")
        )
        commits = per_commit.index.tolist()
        found = (
            steps[
                (steps["case_id"] == row["case_id"])
                & (steps["machine"] == row["machine"])
                & (steps["metric"] == "time_s")
            ]
            if not steps.empty
            else steps
        )
        marks = [int(i) for i in found["index"]] if not found.empty else []
        n, d = int(group["n"].iloc[0]), int(group["d"].iloc[0])
        title = (
            f"n = {n}, d = {d}: {row['machine']}, {row['device_name'] or row['dtype']}, "
            f"{row['dtype']}, {row['mode']}"
        )
        parts.append(f'<figure id="{ident}"><figcaption>{html.escape(title)}</figcaption>')
        parts.append(chart(commits, per_commit["time_s"].tolist(), marks, ident))
        parts.append("</figure>")
        if not found.empty:
            parts.append(_steps_table(found, url, link_pages=False))
        rows = "".join(
            f"<tr><td>{i}</td><td>{commit_link(c, url)}</td>"
            f"<td>{html.escape(str(per_commit.loc[c, 'subject']))}</td>"
            f"<td>{fmt_seconds(float(per_commit.loc[c, 'time_s']))}</td></tr>"
            for i, c in enumerate(commits)
        )
        parts.append(
            f"<details><summary>{len(commits)} commits</summary><table><tr><th>#</th>"
            f"<th>commit</th><th>subject</th><th>time</th></tr>{rows}</table></details>"
        )
    return _page(f"{layer}: time over commits", "\n".join(parts))


def github_commit_url(remote: str) -> str | None:
    """The commit URL template of a GitHub remote (https or ssh); None for another host."""
    match = re.match(
        r"(?:https://github\.com/|git@github\.com:)([^/]+/[^/]+?)(?:\.git)?/?$", remote
    )
    return f"https://github.com/{match.group(1)}/commit/{{commit}}" if match else None
