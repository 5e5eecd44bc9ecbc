"""The operator's tools: the embedded brokers, `relstream status`, `usage`, `replay`,
`reset` and what they read. Imports `clients` and `delivery` (a broker's janitor of
hanging transactions)."""
