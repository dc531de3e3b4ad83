"""Admin tokens: roles, authentication with a short cache, and bootstrap.

Roles: `viewer` may read (GET) everything but tokens; `operator` may also
write. Tenant API keys are a different table and never authenticate here.

Verified tokens are cached for `cache_ttl_s`; while the database is
unreachable a cached token stays valid up to `outage_ttl_s`, so operators can
still see and steer the cluster during a store outage.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session

from gateway.http import errors
from gateway.store import repository
from gateway.store.db import Database, StoreUnavailable

log = logging.getLogger(__name__)

VIEWER = "viewer"
OPERATOR = "operator"
ROLES = (VIEWER, OPERATOR)
MIN_ENV_TOKEN_LEN = 16


@dataclass(frozen=True)
class AdminPrincipal:
    token_id: str
    name: str
    role: str

    @property
    def can_write(self) -> bool:
        return self.role == OPERATOR


class AdminAuthenticator:
    def __init__(
        self,
        db: Database,
        *,
        cache_ttl_s: float = 30.0,
        outage_ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.cache_ttl_s = cache_ttl_s
        self.outage_ttl_s = outage_ttl_s
        self._clock = clock
        self._cache: dict[str, tuple[AdminPrincipal, float]] = {}  # sha256(token) -> (who, verified at)

    async def authenticate(self, token: str | None) -> AdminPrincipal:
        """The principal for a bearer token; `AuthenticationFailed` otherwise."""
        if not token:
            raise errors.AuthenticationFailed("Missing admin token: send `Authorization: Bearer <token>`.")
        digest = hashlib.sha256(token.encode()).hexdigest()
        cached = self._cache.get(digest)
        now = self._clock()
        if cached is not None and now - cached[1] < self.cache_ttl_s:
            return cached[0]

        def lookup(session: Session) -> AdminPrincipal | None:
            row = repository.find_admin_token(session, secret=token, pepper=self.db.pepper)
            return None if row is None else AdminPrincipal(token_id=row.id, name=row.name, role=row.role)

        try:
            principal = await self.db.run_async(lookup)
        except StoreUnavailable:
            if cached is not None and now - cached[1] < self.outage_ttl_s:
                return cached[0]
            raise
        if principal is None:
            self._cache.pop(digest, None)
            raise errors.AuthenticationFailed("Invalid admin token.")
        self._cache[digest] = (principal, now)
        return principal

    def forget(self, token_id: str) -> None:
        """Drop a revoked token from the cache at once."""
        for digest in [d for d, (p, _) in self._cache.items() if p.token_id == token_id]:
            del self._cache[digest]


def _free_name(session: Session, base: str, role: str) -> str:
    """`base`, or `base-2`, `base-3`, ... : the first name no active token of `role` has."""
    name, n = base, 1
    while repository.active_admin_token_named(session, name=name, role=role) is not None:
        n += 1
        name = f"{base}-{n}"
    return name


def bootstrap_admin_token(db: Database, env_token: str | None) -> str | None:
    """Make sure an operator can log in at first start.

    With `env_token` (e.g. from EVOLVING_ADMIN_TOKEN): import it as the
    operator token `env` (`env-2`, ... when an earlier, still active env
    token has that name: names are unique per role) unless already known;
    returns None. Without it:
    if no active admin token exists, create operator `bootstrap` and return
    its secret so the caller prints it once; otherwise None. Blocking; call
    at startup after `db upgrade`.
    """
    if env_token is not None and len(env_token) < MIN_ENV_TOKEN_LEN:
        raise ValueError(f"the admin token from the environment must be at least {MIN_ENV_TOKEN_LEN} characters")
    try:
        return _bootstrap_once(db, env_token)
    except sa_exc.IntegrityError:
        # Another replica starting at the same moment inserted the same name
        # first (SQLite; PostgreSQL serializes on the lock): look again.
        return _bootstrap_once(db, env_token)


def _bootstrap_once(db: Database, env_token: str | None) -> str | None:
    with db.session() as session:
        repository.lock_admin_bootstrap(session)  # replicas starting at once import one token, not two
        if env_token is not None:
            if repository.find_admin_token(session, secret=env_token, pepper=db.pepper) is None:
                row, _ = repository.create_admin_token(
                    session,
                    name=_free_name(session, "env", OPERATOR),
                    role=OPERATOR,
                    pepper=db.pepper,
                    secret=env_token,
                )
                repository.add_audit(
                    session,
                    actor="system",
                    actor_id="system",
                    action="admin_token.import",
                    target=row.id,
                    after={"name": row.name, "role": row.role, "prefix": row.prefix},
                )
            return None
        if repository.count_active_admin_tokens(session) > 0:
            return None
        row, secret = repository.create_admin_token(session, name="bootstrap", role=OPERATOR, pepper=db.pepper)
        repository.add_audit(
            session,
            actor="system",
            actor_id="system",
            action="admin_token.bootstrap",
            target=row.id,
            after={"name": row.name, "role": row.role, "prefix": row.prefix},
        )
        return secret
