#!/usr/bin/env bash
# Fetch the jars of a real Apache Kafka broker into ~/.cache/outboxkit/kafka-<version> (once)
# and print the directory: the same as `outboxkit dev jars` (needs Java 17 and Maven).
set -euo pipefail
exec python -m outboxkit dev jars
