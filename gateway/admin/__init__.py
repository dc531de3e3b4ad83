"""The admin API (`/admin/...`): admin tokens with roles, cluster control,
tenants/keys/policies, history and audit. See `router.build_admin_router`."""

from gateway.admin.auth import AdminAuthenticator, AdminPrincipal, bootstrap_admin_token
from gateway.admin.router import build_admin_router, install_error_handlers

__all__ = [
    "AdminAuthenticator",
    "AdminPrincipal",
    "bootstrap_admin_token",
    "build_admin_router",
    "install_error_handlers",
]
