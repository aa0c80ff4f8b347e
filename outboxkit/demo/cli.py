"""``outboxkit demo`` (filled in by the demo work)."""

import typer

demo_app = typer.Typer(help="Run the whole flow on one machine with no external services.")
