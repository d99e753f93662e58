"""`python -m worker_svc` runs one worker."""

from worker_svc.server import run

run()
