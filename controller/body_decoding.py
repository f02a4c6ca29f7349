"""Request bodies in a Content-Encoding, decoded as they arrive (the KServe REST server,
``controller/kserve_rest.py``). A module of its own, with no protocol imports, so that it
can be used and tested beside any protobuf package."""

from __future__ import annotations

import zlib


class BodyDecoder:
    """A ``gzip`` or ``deflate`` request body decoded as it arrives, in slices (a
    compression bomb is decoded no further than the body bound), and strictly: it must
    end where its data ends. gzip: one member or several one after another (RFC 1952);
    deflate: zlib's format (RFC 1950) or, as some clients send it, raw (RFC 1951).
    aiohttp's own decoding (off: ``auto_decompress=False``) served a gzip body cut short
    as what of it decoded (without its trailer, its CRC unchecked), answered a deflate
    body that did not end in plain text or, now and then, not at all, and logged a
    traceback for every body that did not decode."""

    SLICE = 256 * 1024  # decoded bytes per step

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self.z = None  # the member being decoded; None: none begun
        self.ended = False  # a member (deflate: the data) has ended

    def feed(self, data: bytes):
        """The decoded bytes of ``data``, a slice at a time; ValueError where they do not
        decode."""
        more = False  # the last step filled its slice: zlib may hold decoded bytes still
        while data or more:  # (raw deflate has no trailer to keep input back for them)
            if self.z is None:
                if self.ended and self.coding == "deflate":
                    raise ValueError(f"{len(data)} bytes after the end of its deflate data")
                wbits = zlib.MAX_WBITS | 16 if self.coding == "gzip" else (
                    zlib.MAX_WBITS if data[0] & 0x0F == 8 else -zlib.MAX_WBITS)
                self.z = zlib.decompressobj(wbits)
            try:
                out = self.z.decompress(data, self.SLICE)
            except zlib.error as e:
                raise ValueError(f"its {self.coding} data does not decode ({e})") from None
            if out:
                yield out
            if self.z.eof:  # (gzip: another member may follow)
                data, self.z, self.ended, more = self.z.unused_data, None, True, False
            else:
                data, more = self.z.unconsumed_tail, len(out) == self.SLICE

    def end(self) -> None:
        """ValueError unless the data ended where the body did."""
        if self.z is not None or not self.ended:
            raise ValueError(f"its {self.coding} data ends early (cut short)")
