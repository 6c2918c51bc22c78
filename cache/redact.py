"""The one credential redactor: nothing coordl shows (an error, a repr, a URL) holds a secret.

    Redactor(secrets)(text)         # each secret as ***, a URL's user:password@ as ***@
    redact_url(url)                 # the URL without its user and password
    scrub(text, *urls)              # text with the user and password of each node URL as ***

Who knows the secrets: the object store gathers them from its storage_options and the
environment (`storage/policy.redactor`); a cache node's are in its URL (`url_secrets`: raw,
percent-encoded and decoded).

A URL's credentials are hidden in two ways, by who writes the URL:
- object-store URLs (the default): the user info ends at the first '/', so an object key that
  holds an '@' (``s3://bucket/a@b.jpg``) stays readable;
- cache-node URLs (`whole_userinfo=True`, `scrub`, `redact_url`): a password that was not
  percent-encoded may hold '/' (``redis://:pa/ss@host``), so everything up to the last '@' goes.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable

_USERINFO = re.compile(r"(://)[^/@\s]+@")
_WHOLE_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)\S*@")


class Redactor:
    """Replaces each of `secrets` (at least `shortest` characters; longest first, so a secret that
    holds another is replaced whole) and the credentials of any URL in a text with '***'."""

    def __init__(self, secrets: Iterable[str] = (), shortest: int = 3, whole_userinfo: bool = False) -> None:
        self._secrets = sorted({s for s in secrets if len(s) >= shortest}, key=len, reverse=True)
        self._userinfo = _WHOLE_USERINFO if whole_userinfo else _USERINFO

    def __call__(self, text: object) -> str:
        out = str(text)
        for s in self._secrets:
            out = out.replace(s, "***")
        return self._userinfo.sub(r"\1***@", out)

    def __repr__(self) -> str:
        return f"Redactor({len(self._secrets)} secrets)"


def userinfo(url: str) -> str:
    """The user info of `url`: everything between '://' and its last '@' ("" without one)."""
    rest = url.partition("://")[2]
    return rest.rsplit("@", 1)[0] if "@" in rest else ""


def url_secrets(url: str) -> list[str]:
    """The user and password of `url` (and both together), raw, percent-decoded and percent-encoded."""
    info = userinfo(url)
    if not info:
        return []
    user, _, password = info.partition(":")
    found = {info, password, user} | {urllib.parse.unquote(s) for s in (info, password, user)}
    found |= {urllib.parse.quote(s, safe="") for s in set(found)}
    return sorted(found, key=len, reverse=True)


def redact_url(url: str) -> str:
    """The URL without its user and password (everything before the last '@': a password that
    was not percent-encoded is hidden whole)."""
    head, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return head + sep + rest


def scrub(text: str, *urls: str) -> str:
    """`text` with the user and password of each of `urls` (raw, encoded or decoded) as ***, and
    the credentials of any URL in it as ***@ (a cache node's URLs: `whole_userinfo`)."""
    return Redactor((s for u in urls for s in url_secrets(u)), shortest=2, whole_userinfo=True)(text)
