"""Sieve worker service."""
