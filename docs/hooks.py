"""MkDocs hooks: the figures come from the committed reference runs, and the CLI reference from
the Typer app itself, so neither can drift from what they show."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def cli_reference() -> str:
    """The CLI reference as Markdown, generated from ``attnbench --help``'s own commands."""
    import typer
    import typer.cli

    from attnbench.cli import app

    command = typer.main.get_command(app)
    text = typer.cli.get_docs_for_click(
        obj=command, ctx=typer.models.Context(command), name="attnbench", title="CLI reference"
    )
    intro = (
        "Generated from the command-line app when the site is built: every command and option "
        "that `attnbench --help` lists, with the same help text.\n\n"
    )
    # typer cuts each command's summary at 45 characters ("Measure time, memory, FLOPs,
    # elementwise..."): list them whole instead, each linked to its section.
    for name, sub in command.commands.items():  # type: ignore[attr-defined]
        summary = (sub.help or "").strip().split("\n\n")[0].replace("\n", " ")
        short = next(line for line in text.splitlines() if line.startswith(f"* `{name}`: "))
        text = text.replace(short, f"* [`{name}`](#attnbench-{name}): {summary}", 1)
    head, _, rest = text.partition("\n\n")
    return f"{head}\n\n{intro}{rest}"


def on_files(files: Any, config: Any) -> Any:
    """Adds the reference runs' figures and the generated CLI reference to the site."""
    from mkdocs.structure.files import File  # mkdocs only where the site is built

    for png in sorted((ROOT / "results").glob("**/*.png")):
        files.append(
            File(
                str(png.relative_to(ROOT)),
                src_dir=str(ROOT),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    files.append(File.generated(config, "cli.md", content=cli_reference()))
    return files
