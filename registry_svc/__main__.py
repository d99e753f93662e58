"""`python -m registry_svc` runs the registry service until SIGTERM."""

from __future__ import annotations

import asyncio

from registry_svc.server import main

if __name__ == "__main__":
    asyncio.run(main())
