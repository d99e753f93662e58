"""`python -m intake_svc` runs the intake service."""

from intake_svc.server import run

run()
