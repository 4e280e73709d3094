"""Benchmarks that print ratios; each runs as a module from the repository root, e.g. `python -m bench.ingest`."""
