"""Sieve's shared package: settings, generated stubs, Redis key schema and Lua scripts, database, telemetry.

Everything that more than one service needs lives here, once.
"""
