"""`relstream engine`: the relqueries topic served by a backend, results published."""
