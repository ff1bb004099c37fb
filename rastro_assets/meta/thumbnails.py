"""Thumbnails (Meta layer): copying them from Meta's CDN, with their own safety rules.

The URL is signed and expires; no token is sent with it. Messages name the
URL without its query string, which holds the signature.
"""

from __future__ import annotations

import re

import httpx

from rastro_assets.meta.errors import ErrorKind, MetaError
from rastro_assets.meta.models import Thumbnail
from rastro_assets.meta.session import GraphSession, without_httpx_errors

THUMBNAIL_REASON_CHARS = 120

_QUERY_RE = re.compile(r"\?\S*")


def _without_query(url: httpx.URL) -> str:
    """The URL without its query: signed CDN URLs keep their secret there."""
    return str(url.copy_with(query=None, fragment=None))


def fetch_thumbnail(session: GraphSession, url: str, *, max_bytes: int) -> Thumbnail:
    """Copy an image from Meta's CDN, retrying as the session retries.

    Raises `MetaError` (OTHER: refused, not an image, too big; TRANSIENT: the
    CDN or the network failed, after retries).
    """
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        raise MetaError(ErrorKind.OTHER, "thumbnail URL is not a valid URL") from None
    safe = _without_query(parsed)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise MetaError(ErrorKind.OTHER, f"thumbnail URL {safe} is not an http(s) URL")
    return session.retrying(
        f"thumbnail {safe}",
        lambda: without_httpx_errors(
            lambda: _download(session, parsed, safe, max_bytes),
            timed_out=f"thumbnail {safe} did not arrive within {session.timeout_seconds:g}s",
            failed=f"fetching thumbnail {safe} failed",
        ),
    )


def _download(session: GraphSession, url: httpx.URL, safe: str, max_bytes: int) -> Thumbnail:
    with session.http.stream("GET", url, follow_redirects=True) as response:
        status = response.status_code
        if status != 200:
            raise _refusal(session, response, safe)
        content_type = response.headers.get("content-type", "")
        content_type = content_type.split(";")[0].strip().lower()
        if not content_type.startswith("image/"):
            raise MetaError(
                ErrorKind.OTHER,
                f"thumbnail {safe} answered {content_type or 'no content type'}, not an image",
                http_status=status,
            )
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise MetaError(
                ErrorKind.OTHER,
                f"thumbnail {safe} is {declared} bytes, over the {max_bytes}-byte cap",
                http_status=status,
            )
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > max_bytes:
                raise MetaError(
                    ErrorKind.OTHER,
                    f"thumbnail {safe} is over the {max_bytes}-byte cap",
                    http_status=status,
                )
            chunks.append(chunk)
    data = b"".join(chunks)
    if not data:
        raise MetaError(ErrorKind.OTHER, f"thumbnail {safe} is empty", http_status=status)
    return Thumbnail(content_type=content_type, data=data)


def _refusal(session: GraphSession, response: httpx.Response, safe: str) -> MetaError:
    status = response.status_code
    reason = ""
    if response.headers.get("content-type", "").lower().startswith("text/plain"):
        head = b""
        for chunk in response.iter_bytes():
            head += chunk
            if len(head) >= THUMBNAIL_REASON_CHARS:
                break
        text = head[:THUMBNAIL_REASON_CHARS].decode("utf-8", "replace").strip()
        text = _QUERY_RE.sub("", " ".join(text.split()))
        reason = f": {session.scrub(text)}" if text else ""
    kind = ErrorKind.TRANSIENT if status >= 500 or status == 429 else ErrorKind.OTHER
    return MetaError(kind, f"thumbnail {safe} answered HTTP {status}{reason}", http_status=status)
