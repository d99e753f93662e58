"""The `sieve` command-line tool (console script `sieve`, `python -m sieve.cli`): submit texts and images and
follow them, read tasks, dead letters, workers and statistics, and watch the platform live (`sieve top`).

One module per command group (`submit`, `tasks`, `dlq`, `cluster`, `top`), registered in `main.COMMANDS`; the
shared parts: `config` (flags > SIEVE_* variables > config file), `client` (channels, gRPC errors to exit codes),
`runner` (event loop, clean failures), `output` (tables and JSON), `progress`, `inputs`, `waiting`.
"""
