"""Sources (files, SQL → the rows topic) and sinks (results → files, SQL)."""
