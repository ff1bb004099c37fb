"""Small real images for the fake CDN, written by hand so no imaging library is needed.

The bytes are a pure function of the colours asked for, so the same creative
always yields the same thumbnail (and the same sha256) in every process.
"""

from __future__ import annotations

import struct
import zlib

RGB = tuple[int, int, int]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data))
        + kind
        + data
        + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def png(width: int, height: int, top: RGB, bottom: RGB) -> bytes:
    """An 8-bit RGB PNG shading from `top` to `bottom`."""
    rows = bytearray()
    for y in range(height):
        share = y / max(1, height - 1)
        pixel = bytes(round(a + (b - a) * share) for a, b in zip(top, bottom, strict=True))
        rows += b"\x00" + pixel * width
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        PNG_SIGNATURE
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(bytes(rows), 9))
        + _png_chunk(b"IEND", b"")
    )


# The standard DC table (JPEG Annex K.3); every block here has only a DC
# coefficient, so the AC table needs nothing but end-of-block.
_DC_COUNTS = (0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0)
_DC_SYMBOLS = tuple(range(12))
_AC_COUNTS = (1,) + (0,) * 15
_AC_SYMBOLS = (0x00,)
_QUANT_ONES = bytes([1] * 64)


def _huffman_codes(counts: tuple[int, ...], symbols: tuple[int, ...]) -> dict[int, tuple[int, int]]:
    codes: dict[int, tuple[int, int]] = {}
    code = 0
    index = 0
    for length, count in enumerate(counts, start=1):
        for _ in range(count):
            codes[symbols[index]] = (code, length)
            code += 1
            index += 1
        code <<= 1
    return codes


class _Bits:
    def __init__(self) -> None:
        self.out = bytearray()
        self.acc = 0
        self.n = 0

    def put(self, value: int, length: int) -> None:
        for shift in range(length - 1, -1, -1):
            self.acc = (self.acc << 1) | ((value >> shift) & 1)
            self.n += 1
            if self.n == 8:
                self.out.append(self.acc)
                if self.acc == 0xFF:
                    self.out.append(0x00)
                self.acc = self.n = 0

    def flush(self) -> bytes:
        if self.n:
            self.put((1 << (8 - self.n)) - 1, 8 - self.n)
        return bytes(self.out)


def _ycbcr(rgb: RGB) -> tuple[int, int, int]:
    r, g, b = rgb
    y = 0.299 * r + 0.587 * g + 0.114 * b
    cb = 128 - 0.168736 * r - 0.331264 * g + 0.5 * b
    cr = 128 + 0.5 * r - 0.418688 * g - 0.081312 * b
    return tuple(max(0, min(255, round(v))) for v in (y, cb, cr))  # type: ignore[return-value]


def jpeg(blocks: list[list[RGB]]) -> bytes:
    """A baseline JPEG of 8x8 solid blocks: `blocks[row][col]` is each block's colour."""
    height, width = len(blocks) * 8, len(blocks[0]) * 8
    dc = _huffman_codes(_DC_COUNTS, _DC_SYMBOLS)
    ac = _huffman_codes(_AC_COUNTS, _AC_SYMBOLS)
    bits = _Bits()
    previous = [0, 0, 0]
    for row in blocks:
        for colour in row:
            for component, level in enumerate(_ycbcr(colour)):
                # A flat 8x8 block's DC coefficient is 8 * (level - 128).
                value = 8 * (level - 128)
                diff = value - previous[component]
                previous[component] = value
                category = abs(diff).bit_length()
                bits.put(*dc[category])
                if category:
                    bits.put(diff if diff > 0 else diff + (1 << category) - 1, category)
                bits.put(*ac[0x00])
    scan = bits.flush()

    def segment(marker: int, payload: bytes) -> bytes:
        return struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload

    def dht(table_class: int, table_id: int, counts: tuple[int, ...], symbols: tuple[int, ...]):
        return segment(0xC4, bytes([table_class << 4 | table_id, *counts, *symbols]))

    frame = struct.pack(">BHHB", 8, height, width, 3) + b"".join(
        bytes([component, 0x11, 0]) for component in (1, 2, 3)
    )
    scan_header = bytes([3, 1, 0x00, 2, 0x00, 3, 0x00, 0, 63, 0])
    return (
        b"\xff\xd8"
        + segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
        + segment(0xDB, b"\x00" + _QUANT_ONES)
        + segment(0xC0, frame)
        + dht(0, 0, _DC_COUNTS, _DC_SYMBOLS)
        + dht(1, 0, _AC_COUNTS, _AC_SYMBOLS)
        + segment(0xDA, scan_header)
        + scan
        + b"\xff\xd9"
    )
