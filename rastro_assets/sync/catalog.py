"""The ad catalog (sync layer): one account's catalog and thumbnails, read from Meta, written.

The `ad_catalog` and `ad_thumbnails` assets and `Syncer` (after a spend
sync) call it the same way. The token is opened from the vault inside each
call and never leaves it.

These reads write no `meta_sync_runs` row of their own (that table is the
spend planner's state, one row per spend sync), with one exception: a read
of its own run (`ad_catalog` by hand) that Meta throttles is recorded as a
`manual` sync ended `throttled`, so the planner holds the account as after
any throttled sync and `rastro status` shows `RATE_LIMITED`. A dead token
still marks the connection invalid, as a spend sync would, so every account
it serves pauses at once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime, timedelta
from itertools import islice
from typing import TypeVar

from rastro_assets.meta.client import MetaClient
from rastro_assets.meta.errors import ErrorKind, MetaError
from rastro_assets.meta.models import Ad
from rastro_assets.outcomes import RESTATED_INVALID, ConnectionStatus, Outcome, SyncKind, error_line
from rastro_assets.sync.types import (
    CatalogOutcome,
    CatalogRefused,
    Preview,
    ThumbnailOutcome,
    Wiring,
    outcome_of,
)
from rastro_assets.timekeeping import local_date
from rastro_assets.vault import SecretsKeyError
from rastro_assets.warehouse import catalog as store
from rastro_assets.warehouse import registry
from rastro_assets.warehouse import thumbnails as pictures
from rastro_assets.warehouse.connection import Connection
from rastro_assets.warehouse.errors import AccountNotLinked
from rastro_assets.warehouse.runs import SyncRunEnd, SyncRunStart, record_finished_run

log = logging.getLogger(__name__)

CATALOG_BATCH = 500  # ads merged per transaction while the listing streams in
MISSING_NAMES_LOOKBACK_DAYS = 7  # days before local today: 8 days, the daily re-sync's and today
MAX_MISSING_NAMES = 50
MAX_THUMBNAILS_PER_RUN = 300
THUMBNAIL_CONCURRENCY = 8
MAX_THUMBNAIL_BYTES = 5_000_000
# Downloaded images are written in small batches so at most this many wait in memory.
THUMBNAIL_WRITE_BATCH = 32
PREVIEW_COUNT = 4
PREVIEW_MAX_BYTES = 24_000  # per image: the preview travels in run metadata
PREVIEW_TYPES = ("image/png", "image/jpeg")
MAX_FAILURE_NOTES = 5

# What each image type starts with: a body that does not is no image, whatever
# its content type says, and is never stored.
_MAGIC = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
}
# Signed CDN URLs keep their signature in the query; nothing we log keeps one.
_QUERY = re.compile(r"\?\S*")

T = TypeVar("T")


def _missing_names(
    con: Connection, account: registry.LinkedAccount, now: datetime
) -> list[str]:
    """The ads that brought leads lately but have no name yet, at most `MAX_MISSING_NAMES`."""
    since = local_date(now, account.timezone) - timedelta(days=MISSING_NAMES_LOOKBACK_DAYS)
    return store.missing_ad_names(con, account.ad_account_id, since, limit=MAX_MISSING_NAMES)


def _log_catalog_read(result: CatalogOutcome, run_id: str) -> None:
    log.info(
        "%s catalog (%s, run %s): %d ads read, %d added, %d renamed, %d status changes,"
        " %d in all",
        result.ad_account_id, "full" if result.full else "missing names", run_id,
        result.ads_read, result.added, result.renamed, result.status_changed, result.total_ads,
    )


class _Stop(Exception):
    """Ends a call early with the outcome already filled in."""


class CatalogSyncer(Wiring):
    """Catalog reads and thumbnail copies against one warehouse and one way to Meta."""

    # -- catalog ------------------------------------------------------------------

    def sync_catalog(
        self,
        ad_account_id: str,
        *,
        full: bool,
        run_id: str,
        known: tuple[registry.LinkedAccount, registry.Connection | None] | None = None,
        own_run: bool = False,
    ) -> CatalogOutcome:
        """Bring the account's catalog up to date with Meta.

        `full`: page through every ad of every status. Otherwise ask by id for
        the ads that brought leads since 7 days before local today but have
        no name yet (at most 50), and touch Meta only if there are any.

        `known`: the account and connection as the caller just read them (a
        spend sync), which spares reading them again.

        `own_run`: the read is its run's only Meta work (no spend sync
        records it), so a throttle is recorded for the planner here.

        Raises:
            CatalogRefused: no site links the account.
        """
        now = self.clock()
        result = CatalogOutcome(ad_account_id=ad_account_id, full=full)
        with self.warehouse.connect() as con:
            account, connection = known or self._account(con, ad_account_id)
            missing = [] if full else _missing_names(con, account, now)
        if not full and not missing:
            return result
        try:
            client = self._client(connection, result)
        except _Stop:
            return result
        try:
            self._read_catalog(client, ad_account_id, missing, now, result)
        except MetaError as exc:
            self._fail(result, outcome_of(exc.kind), str(exc))
            result.regain_seconds = exc.regain_seconds or client.stats.usage.regain_seconds
            result.rate_limit = exc.limit
            if result.outcome == Outcome.TOKEN:
                self._mark_token_dead(connection, result.error or "", now)
        except AccountNotLinked:
            self._fail(result, Outcome.OTHER, "the account was unlinked during the catalog read")
        finally:
            result.api_calls = client.stats.api_calls
            result.usage = client.stats.usage
            client.close()
        if own_run and result.outcome == Outcome.THROTTLED:
            self._record_throttle(account, connection, result, run_id=run_id, started_at=now)
        if result.ok:
            _log_catalog_read(result, run_id)
        return result

    def _read_catalog(
        self,
        client: MetaClient,
        ad_account_id: str,
        missing: list[str],
        now: datetime,
        result: CatalogOutcome,
    ) -> None:
        """Every ad (`result.full`), or the `missing` names by id; then count the catalog."""
        if result.full:
            for batch in _batched(client.ads(ad_account_id), CATALOG_BATCH):
                self._write_ads(ad_account_id, batch, now, result, refile=True)
        else:
            result.asked_by_id = len(missing)
            ads = self._ads_by_id(client, missing, ad_account_id)
            # The answer names its account only when Meta says so; an ad of
            # another account is that account's to name.
            ours = [ad for ad in ads if ad.ad_account_id in (None, ad_account_id)]
            result.skipped += len(ads) - len(ours)
            result.named_ids = [ad.ad_id for ad in ours]
            self._write_ads(ad_account_id, ours, now, result, refile=False)
        with self.warehouse.connect() as con:
            result.total_ads = store.catalog_size(con, ad_account_id)

    def _write_ads(
        self, ad_account_id: str, ads: Sequence[Ad], now: datetime, result: CatalogOutcome,
        *, refile: bool,
    ) -> None:
        result.ads_read += len(ads)
        if not ads:
            return
        # A connection per batch: the file is never held while Meta's next page loads.
        with self.warehouse.connect() as con:
            written = store.upsert_catalog(con, ad_account_id, ads, now, refile=refile)
        result.added += written.added
        result.renamed += written.renamed
        result.status_changed += written.status_changed
        result.skipped += written.skipped

    def _ads_by_id(self, client: MetaClient, ad_ids: list[str], ad_account_id: str) -> list[Ad]:
        """`client.ads_by_id`, splitting a batch Meta refuses for permission.

        One ad of an account this token cannot read fails Meta's whole call; it
        must not keep the others unnamed forever.
        """
        try:
            return client.ads_by_id(ad_ids, ad_account_id=ad_account_id)
        except MetaError as exc:
            if exc.kind is not ErrorKind.PERMISSION:
                raise
            if len(ad_ids) == 1:
                log.info("ad %s is not readable with this account's token", ad_ids[0])
                return []
        middle = len(ad_ids) // 2
        return (self._ads_by_id(client, ad_ids[:middle], ad_account_id)
                + self._ads_by_id(client, ad_ids[middle:], ad_account_id))

    # -- thumbnails ---------------------------------------------------------------

    def sync_thumbnails(
        self, ad_account_id: str, *, run_id: str, only: Iterable[str] | None = None
    ) -> ThumbnailOutcome:
        """Copy the pictures the account's catalog lacks or holds for an old creative.

        At most 300 a run, 8 at a time. A download that fails (expired URL,
        not an image, too big, too slow) leaves the stored row as it was and
        is counted in `failed`; the next run tries again with whatever URL
        the catalog then holds. `only` narrows the run to those ads.

        Raises:
            CatalogRefused: no site links the account.
        """
        now = self.clock()
        result = ThumbnailOutcome(ad_account_id=ad_account_id)
        only_ids = None if only is None else list(only)
        with self.warehouse.connect() as con:
            _account, connection = self._account(con, ad_account_id)
            # A paused account's rows wait, untouched, for its new token.
            if connection is not None and connection.status == ConnectionStatus.ACTIVE:
                result.removed = pictures.drop_orphaned_thumbnails(con, ad_account_id)
            wanted = pictures.wanted_thumbnails(
                con, ad_account_id, limit=MAX_THUMBNAILS_PER_RUN, only=only_ids
            )
        try:
            # The CDN takes no token, but a paused account reads nothing from Meta.
            client = self._client(connection, result)
        except _Stop:
            return result
        result.wanted = len(wanted)
        try:
            self._download(client, ad_account_id, wanted, now, result)
        except AccountNotLinked:
            self._fail(
                result, Outcome.OTHER, "the account was unlinked while thumbnails were copied"
            )
        finally:
            client.close()
        if not result.preview and result.ok:
            with self.warehouse.connect() as con:
                result.preview = pictures.latest_thumbnails(
                    con, ad_account_id, limit=PREVIEW_COUNT, content_types=PREVIEW_TYPES,
                    max_bytes=PREVIEW_MAX_BYTES,
                )
        level = logging.WARNING if result.failed else logging.INFO
        log.log(level, "%s thumbnails (run %s): %d wanted, %d fetched, %d failed%s",
                ad_account_id, run_id, result.wanted, result.fetched, result.failed,
                f" (first: {result.failures[0]})" if result.failures else "")
        return result

    def _download(
        self,
        client: MetaClient,
        ad_account_id: str,
        wanted: list[pictures.WantedThumbnail],
        now: datetime,
        result: ThumbnailOutcome,
    ) -> None:
        names = {item.ad_id: item.ad_name for item in wanted}
        ready: list[pictures.FetchedThumbnail] = []

        def flush() -> None:
            if not ready:
                return
            with self.warehouse.connect() as con:
                result.fetched += pictures.store_thumbnails(con, ad_account_id, ready, now)
            for image in ready:
                self._maybe_preview(result, image, names.get(image.ad_id))
            ready.clear()

        queue = iter(wanted)
        with ThreadPoolExecutor(
            max_workers=THUMBNAIL_CONCURRENCY, thread_name_prefix="thumbnail"
        ) as pool:
            # Never more in flight than the pool runs, so finished images are
            # written as they come instead of piling up in futures.
            running: set[Future] = {
                pool.submit(_fetch, client, item)
                for item in islice(queue, THUMBNAIL_CONCURRENCY)
            }
            while running:
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    image, reason = future.result()
                    if image is not None:
                        ready.append(image)
                    else:
                        result.failed += 1
                        if len(result.failures) < MAX_FAILURE_NOTES:
                            result.failures.append(reason)
                    following = next(queue, None)
                    if following is not None:
                        running.add(pool.submit(_fetch, client, following))
                if len(ready) >= THUMBNAIL_WRITE_BATCH:
                    flush()
        flush()

    @staticmethod
    def _maybe_preview(
        result: ThumbnailOutcome, image: pictures.FetchedThumbnail, name: str | None
    ) -> None:
        if (
            len(result.preview) < PREVIEW_COUNT
            and image.content_type in PREVIEW_TYPES
            and len(image.image) <= PREVIEW_MAX_BYTES
        ):
            result.preview.append(Preview(image.ad_id, name, image.content_type, image.image))

    # -- shared -------------------------------------------------------------------

    def _account(self, con, ad_account_id: str):
        account = registry.get_account(con, ad_account_id)
        if account is None:
            raise CatalogRefused(f"{ad_account_id} is not linked to any site")
        return account, registry.get_connection(con, account.connection_id)

    def _client(self, connection, result: CatalogOutcome | ThumbnailOutcome) -> MetaClient:
        """A client with the connection's token, or `_Stop` with the outcome set."""
        if connection is None or connection.status != ConnectionStatus.ACTIVE:
            reason = (connection.last_error if connection else None) or "no valid token"
            self._fail(result, Outcome.TOKEN, f"{RESTATED_INVALID}: {reason}")
            raise _Stop
        try:
            token = self.vault_factory().open(connection.connection_id, connection.sealed_token)
        except SecretsKeyError as exc:
            self._fail(result, Outcome.KEY, str(exc))
            raise _Stop from None
        client = self.client_factory(token)
        del token
        return client

    def _record_throttle(
        self, account, connection, result: CatalogOutcome, *, run_id: str, started_at: datetime
    ) -> None:
        """The throttled read as a `manual` sync of the account's local today, ended `throttled`.

        A throttled catalog read backs the account off as a throttled spend read does
        (docs/errors.md, "A throttle outside the cadence"); the planner's one state is
        `meta_sync_runs`, so this row is what holds the account.
        """
        ended = self.clock()
        today = local_date(started_at, account.timezone)
        regain = result.regain_seconds
        start = SyncRunStart(
            run_id=run_id,
            ad_account_id=result.ad_account_id,
            kind=SyncKind.MANUAL,
            since=today,
            until=today,
            started_at=started_at,
            catalog=result.full,
            token_sealed_at=connection.sealed_at if connection is not None else None,
        )
        end = SyncRunEnd(
            finished_at=ended,
            outcome=result.outcome,
            api_calls=result.api_calls,
            error=result.error,
            usage_pct=result.usage.pct,
            regain_at=ended + timedelta(seconds=regain) if regain else None,
        )
        with self.warehouse.connect() as con:
            record_finished_run(con, start, end)

    def _mark_token_dead(self, connection, message: str, now: datetime) -> None:
        with self.warehouse.connect() as con:
            registry.mark_connection_invalid(
                con, connection.connection_id, message, now, token_sealed_at=connection.sealed_at
            )

    @staticmethod
    def _fail(result: CatalogOutcome | ThumbnailOutcome, outcome: Outcome, message: str) -> None:
        result.outcome = outcome
        result.error = error_line(outcome, safe_text(message))
        log.warning("%s %s", result.ad_account_id, result.error)


def _fetch(
    client: MetaClient, item: pictures.WantedThumbnail
) -> tuple[pictures.FetchedThumbnail | None, str]:
    """One download: the image, or None and why (without the URL's signature)."""
    try:
        thumbnail = client.thumbnail(item.url, max_bytes=MAX_THUMBNAIL_BYTES)
    except MetaError as exc:
        return None, f"ad {item.ad_id}: {safe_text(str(exc))}"
    magic = _MAGIC.get(thumbnail.content_type)
    if magic is not None and not thumbnail.data.startswith(magic):
        return None, f"ad {item.ad_id}: the body is not a {thumbnail.content_type} image"
    return pictures.FetchedThumbnail(
        item.ad_id, item.creative_id, thumbnail.content_type, thumbnail.data
    ), ""


def safe_text(text: str) -> str:
    """`text` without any URL query string (where signed URLs keep their signature)."""
    return _QUERY.sub("", text)


def _batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch
