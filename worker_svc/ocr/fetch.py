"""Fetching the image of an `image_url` task over http(s), within time, size and redirect limits.

One GET per URL (aiohttp, one connection pool per worker): the whole fetch — connecting, every redirect,
the body — must end within `SIEVE_OCR_FETCH_TIMEOUT_S`; the body may be at most `SIEVE_MAX_IMAGE_BYTES`
(refused from Content-Length when the server announces more, else as soon as more arrives, counted
after content decoding). Redirects are followed by hand, at most `SIEVE_OCR_FETCH_MAX_REDIRECTS`, and only
to http or https URLs (a redirect to file:, ftp:, data:… is refused). Anything but 200 is a failure.

Every failure is a `FetchError` whose message names the reason; it fails the task (a URL that did not
answer with an image now is not retried by the worker).
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urljoin, urlsplit

import aiohttp

from sieve.settings import Settings

ALLOWED_SCHEMES = ("http", "https")
_REDIRECTS = (301, 302, 303, 307, 308)
_CHUNK = 64 * 1024


class FetchError(Exception):
    """The image could not be fetched; the message is the task's error."""


class Fetcher:
    """Fetches image URLs for one worker; `close` when done."""

    def __init__(self, settings: Settings) -> None:
        self.timeout_s = settings.ocr_fetch_timeout_s
        self.max_bytes = settings.max_image_bytes
        self.max_redirects = settings.ocr_fetch_max_redirects
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s, sock_read=self.timeout_s),
                headers={"User-Agent": "sieve-ocr-worker", "Accept": "image/*"},
                trust_env=False,
            )
        return self._session

    async def fetch(self, url: str) -> tuple[bytes, float]:
        """The body at `url` and the milliseconds the fetch took; FetchError otherwise."""
        began = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await self._follow(url)
        except TimeoutError:
            raise FetchError(f"image_url: no complete answer within {self.timeout_s:g}s") from None
        except aiohttp.ClientError as exc:
            raise FetchError(f"image_url: {type(exc).__name__}: {exc}") from None
        return body, (time.perf_counter() - began) * 1000

    async def _follow(self, url: str) -> bytes:
        session = self._client()
        for hop in range(self.max_redirects + 1):
            if urlsplit(url).scheme.lower() not in ALLOWED_SCHEMES:
                raise FetchError(f"image_url: refusing a non-http(s) URL {_short(url)}")
            async with session.get(url, allow_redirects=False) as response:
                if response.status in _REDIRECTS:
                    location = response.headers.get("Location")
                    if not location:
                        raise FetchError(f"image_url: HTTP {response.status} without a Location")
                    target = urljoin(url, location)
                    if urlsplit(target).scheme.lower() not in ALLOWED_SCHEMES:
                        raise FetchError(f"image_url: redirect to a non-http(s) URL refused ({_short(target)})")
                    if hop == self.max_redirects:
                        raise FetchError(f"image_url: more than {self.max_redirects} redirects")
                    url = target
                    continue
                if response.status != 200:
                    raise FetchError(f"image_url: HTTP {response.status} {response.reason or ''}".rstrip())
                if response.content_length is not None and response.content_length > self.max_bytes:
                    raise FetchError(f"image_url: body of {response.content_length} bytes is larger than "
                                     f"{self.max_bytes} bytes")
                return await self._read(response)
        raise FetchError(f"image_url: more than {self.max_redirects} redirects")

    async def _read(self, response: aiohttp.ClientResponse) -> bytes:
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(_CHUNK):
            size += len(chunk)
            if size > self.max_bytes:
                raise FetchError(f"image_url: body is larger than {self.max_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _short(url: str, limit: int = 120) -> str:
    return url if len(url) <= limit else url[: limit - 1] + "…"
