"""The Spark pipeline: PySpark Structured Streaming over the outbox topics (``[spark]`` extra)."""
