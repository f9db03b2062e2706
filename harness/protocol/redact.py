"""Credentials out of every URI the harness records or prints.

A tracking URI may carry a secret: a password in its user info (`http://user:pw@host:5000`,
`postgresql+psycopg2://user:pw@db/mlflow`) or a token in its query (`?password=...`,
`&token=...`). The harness connects with the URI as given, but what it writes to the journal,
to the HTML report (which is uploaded to MLflow) or to the console is `redact_uri(uri)`: each
secret replaced by `***`, everything else kept, so the store can still be recognised
(`http://user:***@host:5000`). The user name stays, as in SQLAlchemy's
`URL.render_as_string(hide_password=True)`: it says whose store it is and is not a secret.

`redact_uri` works on any text, not only on a bare URI: a URI also ends up inside error
messages (MLflow's own ones quote the request URL) and command lines.

Standard library only: harness.protocol.errors uses it, and the worker ships the package.
"""

from __future__ import annotations

import re

MASK = "***"

# scheme://user:password@ -- the password runs to the authority's last '@' (an unescaped '@'
# in a password would otherwise leak its tail); the user name has no ':' or '@'.
_USERINFO = re.compile(
    r"(?P<keep>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:]*:)(?P<secret>[^\s/?#]*)(?=@)")
# ?password=... / &token=... / ;api_key=... and names that contain such a word (sslpassword,
# access_token, client_secret).
_QUERY = re.compile(
    r"(?P<keep>[?&;][\w.-]*(?:password|passwd|pwd|token|secret|api[_-]?key|credential)[\w.-]*=)"
    r"(?P<secret>[^&#\s]*)", re.IGNORECASE)


def redact_uri(text: str) -> str:
    """`text` with the secret of every URI in it replaced by `***` (idempotent)."""
    if not isinstance(text, str):
        return text
    for pattern in (_USERINFO, _QUERY):
        text = pattern.sub(lambda m: m["keep"] + (MASK if m["secret"] else ""), text)
    return text


def was_redacted(uri: str) -> bool:
    """Whether `uri` is a redacted one: a secret was replaced by `***`, so it cannot be used to
    connect (the journal only ever keeps URIs in this form)."""
    return any(m["secret"] == MASK for pattern in (_USERINFO, _QUERY)
               for m in pattern.finditer(uri or ""))
