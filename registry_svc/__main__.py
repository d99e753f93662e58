"""`python -m registry_svc` runs the registry service until SIGTERM."""

from registry_svc.server import main
from sieve.rpc import run_main

run_main(main)
