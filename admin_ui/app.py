"""Entry point of the operator console: `streamlit run admin_ui/app.py`.

Logged out, the only page is the login form; logged in, the sidebar lists
the five pages. Every page talks to the gateway through `admin_ui.client`
and nothing else. The admin URL comes from EVOLVING_ADMIN_URL, read once per
browser session (`session.settings`).
"""

from __future__ import annotations

import streamlit as st

from admin_ui import session
from admin_ui.client import AdminApiError

st.set_page_config(page_title="Evolving Infra console", page_icon="⚙️", layout="wide")


def login_page() -> None:
    st.title("Evolving Infra — operator console")
    st.caption(f"Admin API: {session.settings().admin_url}")
    notice = session.take_notice()
    if notice:
        st.warning(notice)
    with st.form("login"):
        token = st.text_input("Admin token", type="password", key="login_token")
        submitted = st.form_submit_button("Log in", type="primary")
    if submitted:
        if not token.strip():
            st.error("Enter an admin token.")
            return
        try:
            session.log_in(token)
        except AdminApiError as exc:
            st.error(f"Login failed — {exc}")
            return
        st.rerun()


def sidebar() -> None:
    who = session.identity()
    assert who is not None  # only called once logged in
    with st.sidebar:
        st.markdown(f"**{who.name}** · `{who.role}`")
        if not who.can_write:
            st.info("Viewer: read-only. Write controls are disabled.")
        st.caption(session.settings().admin_url)
        if st.button("Log out", key="logout"):
            session.log_out()
            st.rerun()


def main() -> None:
    try:
        session.settings()
    except ValueError as exc:  # a bad EVOLVING_* variable: say which, never a traceback
        st.error(f"Console misconfigured: {exc}")
        st.stop()
    if session.identity() is None:
        page = st.navigation([st.Page(login_page, title="Log in", icon=":material/login:")])
    else:
        sidebar()
        page = st.navigation(
            [
                st.Page("views/cluster.py", title="Cluster", icon=":material/hub:", default=True),
                st.Page("views/planner.py", title="Planner", icon=":material/tune:"),
                st.Page("views/history.py", title="History", icon=":material/history:"),
                st.Page("views/tenants.py", title="Tenants", icon=":material/group:"),
                st.Page("views/cache.py", title="Cache", icon=":material/memory:"),
            ]
        )
    page.run()


main()
