"""``outboxkit pipeline`` (filled in by the Spark work). Imports pyspark lazily."""

import typer

pipeline_app = typer.Typer(help="Run the Spark pipeline over the outbox topics.")
