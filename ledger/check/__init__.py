"""Checking what is stored: verify and its record (verify, verified), row checks and their workers
(rowcheck, workers), the chain walk (chainwalk), and replay."""
