"""Live relQueries beside a backfill: priority classes, in the simulator."""
