"""`python -m sieve.cli` runs the `sieve` command."""

from sieve.cli.main import main

main()
