"""Benchmarks: scripts that print numbers, run on demand (`python -m tests.benchmarks.<name>`)."""
