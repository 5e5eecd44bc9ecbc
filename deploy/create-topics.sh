#!/usr/bin/env bash
# Create relstream's topics with explicit partition counts (relstream.kafka.clients.topics.Topics).
# Usage: create-topics.sh BOOTSTRAP [TABLE...]
set -euo pipefail
bootstrap=$1; shift
create() {
  /opt/kafka/bin/kafka-topics.sh --bootstrap-server "$bootstrap" --create --if-not-exists \
    --topic "$1" --partitions "$2" --replication-factor 1
}
create relstream.relqueries 4
create relstream.results 4
create relstream.partial-results 4
create relstream.metrics 1
create relstream.deadletter 1
create relstream.control 1
for table in "$@"; do create "relstream.rows.$table" 4; done
