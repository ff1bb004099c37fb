"""How far a read of the Graph may go (`ReadBounds`), and the error for going past it.

Every answer's body has a byte cap; a paged read may also have a most of pages and a total
time. A Graph that pages without end, dribbles a body a byte at a time or sends one without
end costs a bounded time and memory, then one clear `OutOfBounds`, never retried: asking
again would go as far.
"""

from __future__ import annotations

from dataclasses import dataclass

from rastro_assets.meta.errors import ErrorKind, MetaError

# The most any one answer of the Graph may be. A page of the catalog with its creatives' specs
# is the largest answer read whole; a body past this is no answer, and reading on would let
# whatever answers fill the memory.
GRAPH_BODY_MAX_BYTES = 32 << 20


@dataclass(frozen=True)
class ReadBounds:
    """How far one read of the Graph may go: each answer's bytes, and for a paged read its
    pages and its total time (requests, retries and their pauses, slow bodies: all of it).
    None: no bound but the request timeout."""

    max_body_bytes: int = GRAPH_BODY_MAX_BYTES
    max_pages: int | None = None
    seconds: float | None = None

    def deadline(self, now: float) -> Deadline | None:
        """When a read started at `now` must be over; None without `seconds`."""
        return None if self.seconds is None else Deadline(now + self.seconds, self.seconds)

    def check_page(self, read: int, what: str) -> None:
        """`OutOfBounds` when `read` pages already are as many as may be."""
        if self.max_pages is not None and read >= self.max_pages:
            raise OutOfBounds(f"Meta kept paging {what} past {self.max_pages} pages; stopped")


ANY_ANSWER = ReadBounds()
"""Every answer within `GRAPH_BODY_MAX_BYTES`; no other bound."""


class OutOfBounds(MetaError):
    """An answer or a read went past its `ReadBounds`; asking again would go as far."""

    def __init__(self, message: str, *, http_status: int | None = None) -> None:
        super().__init__(ErrorKind.OTHER, message, http_status=http_status)


@dataclass(frozen=True)
class Deadline:
    """When a bounded read must be over."""

    at: float  # on the session's `monotonic` clock
    seconds: float
    whole_read: bool = True  # False: the deadline of one answer

    def passed(self, what: str) -> OutOfBounds:
        if not self.whole_read:
            return OutOfBounds(f"Meta's answer to {what} took over {self.seconds:g}s; stopped")
        return OutOfBounds(f"Meta's answers to {what} took over {self.seconds:g}s in all; stopped")


@dataclass(frozen=True)
class Limits:
    """What bounds one request: its body's bytes, and the deadline of the read it is part of."""

    max_body_bytes: int
    deadline: Deadline | None


def too_big(what: str, cap: int, status: int) -> OutOfBounds:
    return OutOfBounds(
        f"Meta's answer to {what} is over the {cap:,}-byte cap; not read further",
        http_status=status,
    )
