"""Consumer group membership: static members that rejoin as themselves and leave when they
stop on purpose (`static`). Imports `clients`."""
