"""Documents as a list of blocks (headings, paragraphs, tables, images, lists), rendered to
Markdown or HTML by one function each, so the two never disagree and every Markdown table in the
package is written the same way."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class Block:
    kind: str  # "h1", "h2", "p", "table", "img", "list"
    text: str = ""
    table: pd.DataFrame | None = None
    items: tuple[str, ...] = ()


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(table: pd.DataFrame) -> str:
    """A DataFrame as a GitHub Markdown table (its column names as the header)."""
    lines = ["| " + " | ".join(_cell(c) for c in table.columns) + " |"]
    lines.append("|" + "---|" * len(table.columns))
    for row in table.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def to_markdown(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if b.kind == "h1":
            out.append(f"# {b.text}\n")
        elif b.kind == "h2":
            out.append(f"## {b.text}\n")
        elif b.kind == "p":
            out.append(f"{b.text}\n")
        elif b.kind == "list":
            out.append("".join(f"- {item}\n" for item in b.items))
        elif b.kind == "img":
            out.append(f"![{Path(b.text).stem}]({b.text})\n")
        elif b.kind == "table" and b.table is not None:
            out.append(markdown_table(b.table))
    return "\n".join(out)


_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:70rem;margin:2rem auto;padding:0 1rem}"
    "table{border-collapse:collapse;margin:1rem 0;font-size:.9rem}"
    "td,th{border:1px solid #ccc;padding:.25rem .5rem;text-align:left}"
    "img{max-width:100%;margin:1rem 0}"
)


def to_html(blocks: Sequence[Block]) -> str:
    e = html.escape
    title = next((b.text for b in blocks if b.kind == "h1"), "attnbench report")
    out = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
        f"<style>{_STYLE}</style></head><body>"
    ]
    for b in blocks:
        if b.kind in ("h1", "h2", "p"):
            out.append(f"<{b.kind}>{e(b.text)}</{b.kind}>")
        elif b.kind == "list":
            out.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in b.items) + "</ul>")
        elif b.kind == "img":
            out.append(f"<img src='{e(b.text)}' alt='{e(Path(b.text).stem)}'>")
        elif b.kind == "table" and b.table is not None:
            out.append(b.table.to_html(index=False, border=0, escape=True))
    out.append("</body></html>\n")
    return "\n".join(out)
