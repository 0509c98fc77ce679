"""``attnbench layers``: every layer attnbench can measure here, built-in and plugin."""

from __future__ import annotations

import json
from typing import Annotated, Any

import pandas as pd
import typer

from attnbench.cli.options import json_flag
from attnbench.cli.render import Streams, frame_table
from attnbench.layers import plugins
from attnbench.layers.entry import LayerEntry
from attnbench.layers.registry import REGISTRY
from attnbench.options import parse_layers


def describe(entry: LayerEntry) -> dict[str, Any]:
    """A layer as ``attnbench layers --json`` lists it."""
    theory = entry.theory
    return {
        "name": entry.name,
        "family": entry.family.row,
        "description": entry.description,
        "options": {o.name: o.default for o in entry.options},
        "flops": theory.formula if theory else None,
        "elementwise": theory.elementwise_formula if theory else None,
        "bytes": theory.traffic_formula if theory else None,
        "complexity": theory.complexity if theory else None,
        "sequential": theory.sequential if theory else None,
        "path": theory.path if theory else None,
        "built_for_length": entry.needs_length,
        "source": entry.source.to_dict(),
    }


def layers(
    load: Annotated[
        str | None,
        typer.Option(
            "--layers",
            help="Also load these plugins (module.path:factory, path/to/file.py:factory), "
            "as sweep --layers would.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, json_flag("the layers")] = False,
) -> None:
    """List every layer: built-in, installed plugins and those given.

    Each with its options, family, FLOP, elementwise and bytes formulas, and source.
    """
    problems = plugins.discover()
    if load:
        parse_layers(load)
    found = [describe(entry) for entry in REGISTRY.values()]
    if as_json:
        typer.echo(json.dumps({"layers": found, "not_loaded": problems}, indent=2))
        return
    streams = Streams.make(width=160)
    rows = [
        {
            "layer": item["name"],
            "family": item["family"],
            "options": ", ".join(f"{k}={v}" for k, v in item["options"].items()) or "-",
            "FLOPs (forward)": item["flops"] or "no theory",
            "elementwise (forward)": item["elementwise"] or "no formula",
            "bytes (forward)": item["bytes"] or "no formula",
            "compute": item["complexity"] or "?",
            "sequential": item["sequential"] or "?",
            "path": item["path"] or "?",
            "source": REGISTRY[item["name"]].source.describe(),
        }
        for item in found
    ]
    frame_table(pd.DataFrame(rows), streams.out, title="layers")
    for problem in problems:
        streams.err.print(f"[yellow]not loaded:[/] {problem}", soft_wrap=True, markup=True)
