#!/usr/bin/env bash
# Fetch the jars of a real Apache Kafka broker into ~/.cache/outboxkit/kafka-<version> (once).
# Needs Java 17 and Maven; the tests and the demo's `--broker kafka` run the broker from there.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(sed -n 's|.*<kafka.version>\(.*\)</kafka.version>.*|\1|p' "$here/pom.xml")
dest=${OUTBOXKIT_KAFKA_JARS:-$HOME/.cache/outboxkit/kafka-$version}
if [ -f "$dest/.complete" ]; then
  echo "$dest"
  exit 0
fi
command -v mvn >/dev/null || { echo "Maven is missing: apt-get install maven (or see tests/README.md)" >&2; exit 1; }
tmp="$dest.tmp.$$"
rm -rf "$tmp"
mvn -q -B -f "$here/pom.xml" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" >&2
touch "$tmp/.complete"
rm -rf "$dest"
mv "$tmp" "$dest"
echo "$dest"
