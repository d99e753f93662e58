"""Fetching the image of an `image_url` task over http(s): public destinations only, within time, size
and redirect limits.

One GET per URL through the shared `sieve.outbound.client.SafeHttpClient` (one connection pool per worker),
under the outbound policy of `SIEVE_OUTBOUND_ALLOW_HOSTS` / `SIEVE_OUTBOUND_ALLOW_PRIVATE_NETS`
(`sieve.outbound.policy`): a host any of whose addresses is loopback, private, link-local, CGNAT, unique-local,
multicast, reserved… is refused before anything connects, on the first URL and on every redirect hop, and
the connection goes to exactly the addresses that were checked (no DNS rebinding). The whole fetch —
connecting, every redirect, the body — must end within `SIEVE_OCR_FETCH_TIMEOUT_S`; the body may be at most
`SIEVE_MAX_IMAGE_BYTES` (refused from Content-Length when the server announces more, else as soon as more
arrives). Redirects are followed by hand, at most `SIEVE_OCR_FETCH_MAX_REDIRECTS`, and only to http or
https URLs. Anything but 200 is a failure.

Every failure is a `FetchError` whose message is the task's error and never names an address, a port or a
connector's text ("fetch refused: destination is not a public address", "fetch failed (HTTP 404)",
"fetch failed: timed out"…); its `transient` says whether a later try might succeed. It fails the task (a
URL that did not answer with an image now is not retried by the worker).
"""

from __future__ import annotations

from sieve.outbound.client import ALLOWED_SCHEMES, FetchError, GetAddrInfo, SafeHttpClient
from sieve.outbound.policy import OutboundPolicy
from sieve.settings import Settings

HEADERS = {"User-Agent": "sieve-ocr-worker", "Accept": "image/*"}


class Fetcher:
    """Fetches image URLs for one worker (owns its outbound connection pool); `close` when done."""

    def __init__(self, settings: Settings, *, getaddrinfo: GetAddrInfo | None = None) -> None:
        self.timeout_s = settings.ocr_fetch_timeout_s
        self.max_bytes = settings.max_image_bytes
        self.max_redirects = settings.ocr_fetch_max_redirects
        self.client = SafeHttpClient(
            OutboundPolicy.from_settings(settings),
            timeout_s=self.timeout_s,
            max_bytes=self.max_bytes,
            max_redirects=self.max_redirects,
            headers=HEADERS,
            getaddrinfo=getaddrinfo,
        )

    async def fetch(self, url: str) -> tuple[bytes, float]:
        """The body at `url` and the milliseconds the fetch took; FetchError otherwise."""
        fetched = await self.client.get(url)
        if fetched.status != 200:
            raise FetchError(f"fetch failed (HTTP {fetched.status})", transient=False, status=fetched.status)
        return fetched.body, fetched.elapsed_ms

    async def close(self) -> None:
        await self.client.close()


__all__ = ["ALLOWED_SCHEMES", "FetchError", "Fetcher"]
