"""What the warehouse holds of an ad-day's figures: DECIMAL(18,4) spend, BIGINT counts.

The insights parser refuses a figure beyond these, the Arrow schema carries
them, the spend writer checks them and the DDL declares them; written once
here so the four cannot drift apart. They are the contract's column types:
changing one is a new warehouse migration, not only an edit here.
"""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa

SPEND_PRECISION = 18
SPEND_SCALE = 4
SPEND_INTEGER_DIGITS = SPEND_PRECISION - SPEND_SCALE
SPEND_SQL = f"DECIMAL({SPEND_PRECISION}, {SPEND_SCALE})"
SPEND_TYPE = pa.decimal128(SPEND_PRECISION, SPEND_SCALE)
SPEND_QUANTUM = Decimal(1).scaleb(-SPEND_SCALE)
# A spend's magnitude must stay below this; SPEND_MAX is the largest that fits.
SPEND_LIMIT = Decimal(10) ** SPEND_INTEGER_DIGITS
SPEND_MAX = SPEND_LIMIT - SPEND_QUANTUM

COUNT_SQL = "BIGINT"
COUNT_TYPE = pa.int64()
COUNT_MIN = -(2**63)
COUNT_MAX = 2**63 - 1
