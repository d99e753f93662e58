"""Sieve intake service: validates, authenticates, admits, records and enqueues devices' tasks."""
