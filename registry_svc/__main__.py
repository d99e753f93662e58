"""`python -m registry_svc` runs the registry service until SIGTERM."""

from registry_svc.server import run

run()
