"""The validity dates of X.509 certificates, and what is wrong with them at a given time.

    certs = pem_certificates(open("server.pem").read())   # [DER bytes, ...]
    not_before, not_after = validity(certs[0])             # aware datetimes, UTC
    date_problem(certs[0])              # "expired on ... (notBefore ..., notAfter ...; now ...)" or None

The standard library verifies certificates but does not read their dates back
(``ssl.getpeercert()`` gives them only for a certificate it has verified), so the
few fields needed are read from the DER encoding here: Certificate ::= SEQUENCE {
tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber, signature, issuer,
validity SEQUENCE { notBefore Time, notAfter Time }, ... }, ... } (RFC 5280 4.1).
Nothing is trusted from these dates: they only explain a failure, or refuse a
certificate that every client would refuse.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re

_PEM = re.compile(r"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.S)
_SEQUENCE, _VERSION, _UTC_TIME, _GENERALIZED_TIME = 0x30, 0xA0, 0x17, 0x18


def pem_certificates(text: str) -> list[bytes]:
    """The DER bytes of every ``CERTIFICATE`` block of a PEM text (keys and other blocks skipped);
    ValueError for a block that is not base64."""
    try:
        return [base64.b64decode("".join(block.split()), validate=True) for block in _PEM.findall(text)]
    except binascii.Error as e:
        raise ValueError(f"a CERTIFICATE block is not base64 ({e})") from None


def _element(der: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of content, end of content) of the DER element at `pos`."""
    if pos + 2 > len(der):
        raise ValueError("truncated DER")
    tag, length, pos = der[pos], der[pos + 1], pos + 2
    if length & 0x80:
        n = length & 0x7F
        if not 0 < n <= 4 or pos + n > len(der):
            raise ValueError("bad DER length")
        length, pos = int.from_bytes(der[pos:pos + n], "big"), pos + n
    if pos + length > len(der):
        raise ValueError("truncated DER")
    return tag, pos, pos + length


def _time(tag: int, raw: bytes) -> dt.datetime:
    text = raw.decode("ascii")
    if tag == _UTC_TIME:  # YYMMDDHHMMSSZ, years 1950..2049 (RFC 5280 4.1.2.5.1)
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    elif tag != _GENERALIZED_TIME:
        raise ValueError(f"validity time of tag {tag:#x}")
    return dt.datetime.strptime(text, "%Y%m%d%H%M%SZ").replace(tzinfo=dt.timezone.utc)


def validity(der: bytes) -> tuple[dt.datetime, dt.datetime]:
    """(notBefore, notAfter) of a DER certificate, UTC; ValueError when it is not one."""
    tag, pos, _ = _element(der, 0)
    tbs_tag, pos, tbs_end = _element(der, pos)
    if tag != _SEQUENCE or tbs_tag != _SEQUENCE:
        raise ValueError("not an X.509 certificate")
    fields = []
    while pos < tbs_end and len(fields) < 5:
        tag, start, end = _element(der, pos)
        if not (tag == _VERSION and not fields):
            fields.append((tag, start, end))
        pos = end
    if len(fields) < 4 or fields[3][0] != _SEQUENCE:  # serial, signature, issuer, validity
        raise ValueError("not an X.509 certificate")
    _, pos, end = fields[3]
    tag1, s1, e1 = _element(der, pos)
    tag2, s2, e2 = _element(der, e1)
    return _time(tag1, der[s1:e1]), _time(tag2, der[s2:e2])


def shown(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def date_problem(der: bytes, now: dt.datetime | None = None) -> str | None:
    """What to say after the certificate's name: 'expired on A (notBefore B, notAfter A; now N)',
    'is not yet valid: valid from B (...)', or None when `now` (default: the current time) is
    within its dates."""
    not_before, not_after = validity(der)
    now = now or dt.datetime.now(dt.timezone.utc)
    dates = f"notBefore {shown(not_before)}, notAfter {shown(not_after)}"
    if now > not_after:
        return f"expired on {shown(not_after)} ({dates}; now {shown(now)})"
    if now < not_before:
        return f"is not yet valid: valid from {shown(not_before)} ({dates}; now {shown(now)})"
    return None
