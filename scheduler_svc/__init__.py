"""Sieve scheduler service: fair per-device scheduling and the workers' Pull streams."""
