#!/usr/bin/env bash
# Create relstream's topics with explicit partition counts (relstream.kafka.clients.topics.Topics).
# Usage: create-topics.sh BOOTSTRAP [TABLE...]
# Replication: REPLICATION=N and MIN_INSYNC=N in the environment (Topics.replication and
# Topics.min_insync); unset, the cluster's own default.replication.factor and
# min.insync.replicas apply.
set -euo pipefail
bootstrap=$1; shift
options=()
if [[ -n "${REPLICATION:-}" ]]; then options+=(--replication-factor "$REPLICATION"); fi
if [[ -n "${MIN_INSYNC:-}" ]]; then options+=(--config "min.insync.replicas=$MIN_INSYNC"); fi
create() {
  /opt/kafka/bin/kafka-topics.sh --bootstrap-server "$bootstrap" --create --if-not-exists \
    --topic "$1" --partitions "$2" "${options[@]}"
}
create relstream.relqueries 4
create relstream.results 4
create relstream.partial-results 4
create relstream.metrics 1
create relstream.deadletter 1
create relstream.control 1
for table in "$@"; do create "relstream.rows.$table" 4; done
