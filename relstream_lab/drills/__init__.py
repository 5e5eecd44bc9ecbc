"""The drills: a hostile flood and a broker outage against running processes."""
