"""The command line (``attnbench``): a thin layer of Typer commands over the core."""

from attnbench.cli.app import app, main

__all__ = ["app", "main"]
