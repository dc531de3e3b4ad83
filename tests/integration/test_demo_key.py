"""The demo key `up` prints, checked against a real store (SQLite)."""

from __future__ import annotations

import pathlib
import stat

from cli.demo_key import DEMO_KEY_FILE, demo_key, key_tenant
from gateway.compose import ControlPlane
from gateway.settings import GatewaySettings
from gateway.store import repository


def _control_plane(data: pathlib.Path) -> ControlPlane:
    return ControlPlane.build(GatewaySettings(data_dir=str(data), secret_pepper="pepper"))


def test_demo_key_is_minted_once_then_checked_and_a_dead_one_gives_a_hint(tmp_path: pathlib.Path) -> None:
    cp = _control_plane(tmp_path)
    try:
        first = demo_key(cp, tmp_path)
        assert first.secret and first.tenant == "demo" and first.problem is None
        path = tmp_path / DEMO_KEY_FILE
        assert path.read_text().strip() == first.secret and stat.S_IMODE(path.stat().st_mode) == 0o600
        again = demo_key(cp, tmp_path)
        assert again.secret == first.secret  # read, checked, not re-minted

        # The operator revokes it: no snippet with a key that answers 401, a hint instead.
        with cp.db.session() as s:
            (key,) = repository.list_api_keys(s, tenant_id="demo")[0]
            repository.revoke_api_key(s, tenant_id="demo", key_id=key.id)
        dead = demo_key(cp, tmp_path)
        assert dead.secret is None and f"delete {path}" in (dead.problem or "")
        assert key_tenant(cp, first.secret) is None

        # Following the hint mints a new key for the existing tenant.
        path.unlink()
        fresh = demo_key(cp, tmp_path)
        assert fresh.secret and fresh.secret != first.secret and key_tenant(cp, fresh.secret) == "demo"

        # A deleted tenant takes its keys with it: the same hint.
        with cp.db.session() as s:
            repository.delete_tenant(s, tenant_id="demo")
        assert demo_key(cp, tmp_path).problem is not None
        path.unlink()
        assert demo_key(cp, tmp_path).tenant == "demo"  # and the tenant comes back on a new mint
        with cp.db.session() as s:
            actors = {a.actor_id for a in repository.list_audit(s, action="api_key.create")[0]}
        assert actors == {"system"}
    finally:
        cp.db.dispose()


def test_open_auth_has_no_key(tmp_path: pathlib.Path) -> None:
    cp = ControlPlane.build(GatewaySettings(data_dir=str(tmp_path), auth="open"))
    try:
        k = demo_key(cp, tmp_path)
        assert k.secret is None and k.problem is None and not (tmp_path / DEMO_KEY_FILE).exists()
    finally:
        cp.db.dispose()
