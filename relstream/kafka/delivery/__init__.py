"""What a task publishes, and the commit that follows it: publishing through outages
(`publish`), one delivery layer for every task (`outputs`), dead letters (`letters`) and
exactly once by transactions, their faults and their outcomes. Imports `clients`."""
