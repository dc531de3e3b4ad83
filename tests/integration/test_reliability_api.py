"""Bad input on the gateway's public and admin APIs: property-based (schemathesis
over the gateway's own OpenAPI document, plus hypothesis for headers) and
targeted (body limits, invalid UTF-8, absurd numbers, giant max_tokens,
header injection). The gateway runs on real HTTP in front of fake workers
(`testing.fake_worker`) with the control plane (SQLite store, tenant keys,
admin API); the property is always: no 5xx, no crash, no hang, errors are
OpenAI-shaped.

The stack is `testing.stacks.control_plane_stack`.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import Phase as HypothesisPhase
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from core.ids import ID_RE as BRANCH_ID_RE
from gateway.serving.openai.schemas import ChatCompletionRequest, CompletionRequest
from testing.stacks import MAX_BODY, MODEL, ControlPlaneStack, assert_openai_error, control_plane_stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneStack]:
    with control_plane_stack(tmp_path_factory.mktemp("reliability-api")) as s:
        yield s


@pytest.fixture(scope="module")
def key(stack: ControlPlaneStack) -> str:
    return stack.tenant("fuzz")


def _ok_chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3, **extra}


def _still_serving(stack: ControlPlaneStack, key: str) -> None:
    r = httpx.post(
        f"{stack.url}/v1/chat/completions", json=_ok_chat(), timeout=10, headers={"Authorization": f"Bearer {key}"}
    )
    assert r.status_code == 200, r.text
    assert httpx.get(f"{stack.url}/readyz", timeout=5).status_code == 200


# -- property-based: the OpenAPI document ---------------------------------------------
def openapi_with_bodies(app: Any) -> dict[str, Any]:
    """The gateway's OpenAPI document, with the OpenAI routes' request bodies
    and branch headers described (the routes read raw bodies to enforce the
    size limit, so FastAPI cannot document them itself)."""
    spec = app.openapi()
    components = spec.setdefault("components", {}).setdefault("schemas", {})
    headers: list[dict[str, Any]] = [
        {
            "name": h,
            "in": "header",
            "required": False,
            "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:\\-]{1,128}$"},
        }
        for h in ("X-Branch-ID", "X-Parent-Branch-ID", "X-Session-ID")
    ]
    headers.append(
        {
            "name": "X-Branch-Finished",
            "in": "header",
            "required": False,
            "schema": {"type": "string", "enum": ["true", "false"]},
        }
    )
    for path, model in (("/v1/chat/completions", ChatCompletionRequest), ("/v1/completions", CompletionRequest)):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        op = spec["paths"][path]["post"]
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
        op["parameters"] = list(headers)
    return spec


# Operations that would tear the harness down mid-run (revoking our own
# operator token is refused anyway; deleting random tenants is harmless).
_SKIP = {("DELETE", "/admin/tokens/{token_id}")}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_every_operation_answers_without_5xx(stack: ControlPlaneStack, key: str, mode: str) -> None:
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_dict(openapi_with_bodies(stack.app))
    generation = GenerationMode.POSITIVE if mode == "positive" else GenerationMode.NEGATIVE
    failures: list[str] = []
    seen = 0
    for result in schema.get_all_operations():
        op = result.ok()  # type: ignore[union-attr]  # an Err has no ok(): a schema it cannot read fails the test
        if (op.method.upper(), op.path) in _SKIP:
            continue
        auth = stack.admin_headers() if op.path.startswith("/admin") else {"Authorization": f"Bearer {key}"}

        # Failures are collected, not raised: shrinking a network case costs minutes.
        @settings(
            max_examples=12,
            deadline=None,
            database=None,
            phases=[HypothesisPhase.generate],
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=op.as_strategy(generation_mode=generation))
        def check(case: Any) -> None:
            where = f"{op.method.upper()} {op.path}"  # noqa: B023 - run below, before `op` changes
            what = f"(body={str(case.body)[:300]}, query={case.query}, headers={case.headers})"
            try:  # `requests` raises on a hang (timeout) or a dropped connection
                r = case.call(base_url=stack.url, headers=auth, timeout=15)  # noqa: B023 - as above
            except Exception as exc:  # noqa: BLE001 - reported below with the case
                failures.append(f"{where}: no answer: {exc!r} {what}")
                return
            if r.status_code >= 500:
                failures.append(f"{where} -> {r.status_code}: {r.text[:300]} {what}")
            elif r.status_code >= 400 and "application/json" in str(r.headers.get("content-type", "")):
                body = r.json()
                if not (isinstance(body.get("error"), dict) and body["error"].get("message")):
                    failures.append(f"{where} -> {r.status_code} not OpenAI-shaped: {r.text[:300]} {what}")

        with contextlib.suppress(Unsatisfiable):  # no negative case exists for this operation
            check()
        seen += 1
    assert seen >= 20  # the OpenAI surface plus the admin API
    _still_serving(stack, key)
    if failures:  # pytrace=False: pytest's source rendering of hypothesis frames trips CPython 3.11
        pytest.fail("\n".join(failures[:10]), pytrace=False)


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    phases=[HypothesisPhase.generate],
)
@given(value=st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=200))
def test_branch_header_values_are_validated_or_refused(stack: ControlPlaneStack, key: str, value: str) -> None:
    try:
        r = httpx.post(
            f"{stack.url}/v1/chat/completions",
            json=_ok_chat(max_tokens=1),
            timeout=10,
            headers={  # bytes: the value goes out as is (latin-1), never re-encoded by httpx
                b"Authorization": f"Bearer {key}".encode(),
                b"X-Branch-ID": value.encode("latin-1"),
                b"X-Branch-Finished": b"true",
            },
        )
    except httpx.LocalProtocolError:
        # The client refuses to send it (h11: no leading/trailing whitespace in a
        # header value): it never reaches the gateway, so it says nothing about it.
        reject()
    stripped = value.strip(" \t")
    if stripped and BRANCH_ID_RE.match(stripped):
        assert r.status_code == 200, r.text
        assert r.headers["X-Branch-ID"] == stripped
    elif not stripped:
        assert r.status_code == 200  # empty header: a one-request branch
    else:
        err = assert_openai_error(r, 400)
        assert err["param"] == "X-Branch-ID"


# -- targeted -------------------------------------------------------------------------
def _post(
    stack: ControlPlaneStack,
    key: str,
    content: bytes | Any,
    path: str = "/v1/chat/completions",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    return httpx.post(
        f"{stack.url}{path}",
        content=content,
        timeout=15,
        headers={"Authorization": f"Bearer {key}", "content-type": "application/json", **(headers or {})},
    )


def test_body_size_limit_declared_and_streamed(stack: ControlPlaneStack, key: str) -> None:
    big = b'{"model": "demo", "messages": [{"role": "user", "content": "' + b"x" * MAX_BODY + b'"}]}'
    assert assert_openai_error(_post(stack, key, big), 413)["code"] == "payload_too_large"

    def chunks() -> Iterator[bytes]:  # no content-length: the limit holds while streaming
        yield b'{"model": "demo", "messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"y" * 4096
        yield b'"}]}'

    assert assert_openai_error(_post(stack, key, chunks()), 413)["code"] == "payload_too_large"
    # A declared length over the limit is refused before the body is read.
    raw = _raw(
        stack.url,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + key.encode()
        + b"\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 999999999\r\n\r\n{}",
    )
    assert raw.startswith(b"HTTP/1.1 413"), raw[:200]
    _still_serving(stack, key)


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "demo", "messages": [{"role": "user", "content": "\xff\xfe\xfd"}]}',  # invalid UTF-8
        b'\xef\xbb\xbf{"model": "demo"}',  # UTF-8 BOM
        b"[" * 50_000,  # nesting bomb
        b'{"model": "demo", "messages": [{"role": "user", "content": "\\ud800"}]}',  # lone surrogate
        b'{"model": "demo", "messages": "hi"}',
        b'{"model": 5, "messages": [{"role": "user", "content": "hi"}]}',
        b'{"model": "demo", "messages": [{"role": "wizard", "content": "hi"}]}',
        b'{"model": "demo", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
        b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "temperature": 1e308}',
        b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "temperature": -1}',
        b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "top_p": 0}',
        b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "seed": -1}',
        b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "seed": 18446744073709551616}',
        b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}',
        b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "stop": ' + b'["a"' + b',"a"' * 20 + b"]}",
        b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "n": 1000000}',
        b"",
        b"null",
    ],
)
def test_malformed_bodies_get_400(stack: ControlPlaneStack, key: str, body: bytes) -> None:
    assert_openai_error(_post(stack, key, body), 400)


@pytest.mark.parametrize("max_tokens", [2000, 1_000_000, 1_000_001, 10**9, 2**63, 10**30])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_giant_max_tokens_is_a_client_error(stack: ControlPlaneStack, key: str, max_tokens: int, path: str) -> None:
    body = (
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        if "chat" in path
        else {"model": MODEL, "prompt": "hi"}
    )
    r = httpx.post(
        f"{stack.url}{path}",
        json={**body, "max_tokens": max_tokens},
        timeout=15,
        headers={"Authorization": f"Bearer {key}"},
    )
    assert_openai_error(r, 400)
    _still_serving(stack, key)


@pytest.mark.parametrize("prompt", [[-1], [10**12], [1.5], [[1, 2]], [], "", ["a", "b"]])
def test_completion_prompt_shapes(stack: ControlPlaneStack, key: str, prompt: Any) -> None:
    r = httpx.post(
        f"{stack.url}/v1/completions",
        json={"model": MODEL, "prompt": prompt, "max_tokens": 2},
        timeout=15,
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        assert_openai_error(r)


def test_unknown_model_and_paths(stack: ControlPlaneStack, key: str) -> None:
    auth = {"Authorization": f"Bearer {key}"}
    err = assert_openai_error(
        httpx.post(f"{stack.url}/v1/chat/completions", json={**_ok_chat(), "model": "gpt-9"}, headers=auth, timeout=10),
        404,
    )
    assert err["code"] == "model_not_found"
    assert httpx.get(f"{stack.url}/v1/models/../../admin/tokens", headers=auth, timeout=10).status_code in (401, 404)
    assert_openai_error(httpx.get(f"{stack.url}/v1/models/nope", headers=auth, timeout=10), 404)
    assert httpx.delete(f"{stack.url}/v1/chat/completions", headers=auth, timeout=10).status_code == 405


def _raw(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)  # no half-close: uvicorn takes it for a client that left
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


@pytest.mark.parametrize(
    "header",
    [
        b"X-Branch-ID: a\r\nX-Branch-Finished: true",  # injected as a second header: ids stay validated
        b"X-Branch-ID: a\rSet-Cookie: x=1",  # bare CR
        b"X-Branch-ID: a\nSet-Cookie: x=1",  # bare LF
        b"X-Branch-ID: a\x00b",  # NUL
        b"X-Branch-ID: " + b"a" * 129,
        b"X-Branch-ID: ../../etc/passwd",
        b"X-Branch-ID: caf\xc3\xa9",
    ],
)
def test_header_injection_in_branch_ids(stack: ControlPlaneStack, key: str, header: bytes) -> None:
    body = b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}'
    req = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + key.encode()
        + b"\r\nContent-Type: application/json\r\n"
        + header
        + b"\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\nConnection: close\r\n\r\n"
        + body
    )
    raw = _raw(stack.url, req)
    status = int(raw.split(b" ", 2)[1])
    assert status in (200, 400), raw[:400]
    head = raw.split(b"\r\n\r\n", 1)[0].lower()
    assert b"set-cookie" not in head  # nothing the client sent is reflected as a header
    if status == 200:  # only the valid "a" can have been accepted, and it is echoed verbatim
        assert b"x-branch-id: a\r\n" in head + b"\r\n"
    _still_serving(stack, key)


def test_admin_api_rejects_garbage(stack: ControlPlaneStack, key: str) -> None:
    op = stack.admin_headers()
    cases = [
        ("POST", "/admin/switch", b'{"node_id": "w0", "to_phase": "sideways"}'),
        ("POST", "/admin/switch", b'{"node_id": "' + b"x" * 10000 + b'", "to_phase": "decode"}'),
        ("PUT", "/admin/pins/split", b'{"prefill_nodes": -1}'),
        ("PUT", "/admin/pins/split", b'{"prefill_nodes": 99999999999999999999}'),
        ("PUT", "/admin/planner/mode", b'{"mode": "\xff"}'),
        ("POST", "/admin/tenants", b'{"name": ""}'),
        ("POST", "/admin/tenants", b"[" * 50_000),
        ("GET", "/admin/switches?limit=-5", b""),
        ("GET", "/admin/switches?since=yesterday", b""),
        ("GET", "/admin/cluster/history?minutes=1e400", b""),
    ]
    for method, path, body in cases:
        r = httpx.request(
            method, f"{stack.url}{path}", content=body, timeout=15, headers={**op, "content-type": "application/json"}
        )
        assert 400 <= r.status_code < 500, (method, path, r.status_code, r.text[:200])
        assert_openai_error(r)
    assert httpx.get(f"{stack.url}/admin/cluster", headers=op, timeout=10).status_code == 200
    _still_serving(stack, key)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/admin/tenants?offset=100000000000000000000", None),
        ("GET", "/admin/switches?offset=18446744073709551616", None),
        ("GET", "/admin/decisions?offset=9223372036854775808", None),
        ("POST", "/admin/tenants", {"name": "huge", "policy": {"requests_per_minute": 10**30}}),
        ("POST", "/admin/tenants", {"name": "huge2", "policy": {"max_active_branches": 2**64}}),
    ],
)
def test_admin_huge_integers_are_client_errors(
    stack: ControlPlaneStack, method: str, path: str, body: dict[str, Any] | None
) -> None:
    """Integers past 64 bits reach the database unchecked (OverflowError -> 500)."""
    r = httpx.request(method, f"{stack.url}{path}", json=body, headers=stack.admin_headers(), timeout=15)
    if r.status_code >= 500:
        pytest.fail(f"{method} {path} -> {r.status_code}: {r.text}", pytrace=False)
    assert_openai_error(r, 400)
