"""Benchmarks that print a table (timing goals live here, not in tests)."""
