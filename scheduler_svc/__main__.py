"""`python -m scheduler_svc` runs the scheduler service."""

from scheduler_svc.server import run

run()
