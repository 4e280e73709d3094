"""The event contract: the envelope and every kind's payload (events), canonical JSON and hashes
(canonical), strict JSON (parsing), the checks (validation), the typed columns (columns, metricnames),
and whose producer names are reserved (roles)."""
