"""Credentials out of what hcp-tune writes or prints: the one place that knows what a
secret looks like in a command line, a URL or an error message.

A database password can reach hcp-tune in a URL's user part
(``postgresql://user:PASSWORD@host/db``), in its query string (``?password=...``, as libpq
accepts it) or in a libpq key=value string (``host=db password=...``). Every file the
tool writes that holds text a user typed (a sweep's running marker, the folder's
remembered database) and every error line goes through ``redact``; the password then comes
from ~/.pgpass or PGPASSWORD, which nothing here reads or writes.

Part of the contract: standard library only, so the job side may use it as well.
"""
from __future__ import annotations

import re

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]*")
# ``scheme://user:password@``: the password stops at '@' or '/' (an unencoded '/' ends
# the authority part for every URL parser, so it cannot be in one)
_USERINFO = re.compile(r"^(?P<head>[^:/]+://[^/@:]*):[^@/]*@")
# ``password=...`` in a URL's query: the pair is dropped
_QUERY = re.compile(r"(?i)(?P<sep>[?&])(?:password|passwd|sslpassword)=[^&#]*&?")
# ``password=...`` anywhere else (a libpq key=value string): the value is hidden
_PAIR = re.compile(r"(?i)\b(?P<key>password|passwd|sslpassword)=[^&\s'\"]*")
HIDDEN = "<hidden>"


def _url(match: re.Match) -> str:
    url = _USERINFO.sub(r"\g<head>@", match.group(0))
    url = _QUERY.sub(r"\g<sep>", url)
    return url[:-1] if url[-1:] in "?&" else url


def redact(text: str) -> str:
    """``text`` with every password named above removed: a URL keeps its user, host,
    database and the rest of its query; a key=value pair outside a URL reads
    ``password=<hidden>``. Text without a password is returned unchanged."""
    if "://" in text:
        text = _URL.sub(_url, text)
    return _PAIR.sub(rf"\g<key>={HIDDEN}", text)


def redact_all(items: list[str]) -> list[str]:
    """``redact`` of each item (a command line's arguments)."""
    return [redact(str(item)) for item in items]
