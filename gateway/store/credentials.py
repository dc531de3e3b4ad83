"""Secrets for tenant API keys and admin tokens: generated once, stored only as
a salted, peppered HMAC-SHA256 plus a short visible prefix.

The secrets are 256-bit random strings, so a fast keyed hash is enough (a slow
KDF protects low-entropy passwords, which these are not) and keeps
verification cheap on the request path. The pepper is a server-side secret
kept out of the database; a stolen database alone cannot verify guesses.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets as _random
from dataclasses import dataclass

TENANT_KEY_PREFIX = "sk-ei-"
ADMIN_TOKEN_PREFIX = "eia-"
# Characters of a secret kept in clear: enough to tell keys apart in a list
# and to look a key up by index, far too few to guess the rest.
VISIBLE_PREFIX_LEN = 12


@dataclass(frozen=True)
class NewSecret:
    secret: str  # shown once, never stored
    prefix: str
    salt: str
    secret_hash: str


def hash_secret(secret: str, *, salt: str, pepper: str) -> str:
    """Hex HMAC-SHA256 of salt+secret keyed by the pepper."""
    return hmac.new(pepper.encode(), (salt + secret).encode(), hashlib.sha256).hexdigest()


def verify_secret(secret: str, *, salt: str, pepper: str, secret_hash: str) -> bool:
    """Constant-time comparison against the stored hash."""
    return hmac.compare_digest(hash_secret(secret, salt=salt, pepper=pepper), secret_hash)


def visible_prefix(secret: str) -> str:
    return secret[:VISIBLE_PREFIX_LEN]


def seal_secret(secret: str, *, pepper: str) -> NewSecret:
    """Salt and hash a given secret (an imported token)."""
    salt = _random.token_hex(16)
    return NewSecret(
        secret=secret,
        prefix=visible_prefix(secret),
        salt=salt,
        secret_hash=hash_secret(secret, salt=salt, pepper=pepper),
    )


def new_secret(kind_prefix: str, *, pepper: str) -> NewSecret:
    """A fresh random secret starting with `kind_prefix` (tenant key or admin token)."""
    return seal_secret(kind_prefix + _random.token_urlsafe(32), pepper=pepper)


def new_id(kind: str) -> str:
    """Opaque row id such as `ten_3f9a...`; never a secret."""
    return f"{kind}_{_random.token_hex(8)}"
