"""Tokens that expire, rotate and record their last use; Studio sessions kept server-side; failed authentication
rate-limited. Against real servers (uvicorn on 127.0.0.1) over real stores; where the store holds the state
(sessions, last use), on SQLite and on PostgreSQL, with two servers sharing one store."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from jixu.ledger import SQLiteStore, Store
from jixu.server import create_app, create_token
from jixu.server.auth import USE_KEY_PREFIX, list_tokens, parse_duration
from jixu.server.guard import AuthGuard, FailureLimit
from jixu.server.problems import HTTPProblem
from jixu.server.studio import studio_router
from jixu.server.studio.session import COOKIE, SESSION_KEY_PREFIX, session_key
from tests.conftest import PostgresSchema
from tests.helpers import ROOT, run_jixu
from tests.server.conftest import Api, LiveServer
from tests.server.test_auth_and_problems import assert_problem


def whoami(url: str, secret: str) -> httpx.Response:
    return httpx.get(f"{url}/api/v1/whoami", headers={"Authorization": f"Bearer {secret}"})


# --- expiry ----------------------------------------------------------------------------------------------------


def test_an_expired_token_is_a_401_that_says_so_and_is_listed_as_expired(api: Api) -> None:
    admin = api.client("admin")
    made = admin.post("/tokens", json={"name": "brief", "roles": {"alpha": "viewer"}, "expires_in": 1})
    assert made.status_code == 201, made.text
    secret, token = made.json()["secret"], made.json()["token"]
    assert token["expires_at"] is not None and token["expired"] is False
    assert whoami(api.url, secret).json()["expires_at"] == token["expires_at"]
    time.sleep(1.2)
    body = assert_problem(whoami(api.url, secret), 401, "token_expired")
    assert body["expires_at"] == token["expires_at"] and token["token_id"] in body["detail"]
    listed = {t["token_id"]: t for t in admin.get("/tokens").json()["tokens"]}
    assert listed[token["token_id"]]["expired"] is True
    assert listed[api.token_ids["admin"]]["expired"] is False and listed[api.token_ids["admin"]]["expires_at"] is None
    # Only a caller that knows the secret learns it expired: a wrong secret is the plain 401.
    wrong = f"jixu_{token['token_id']}_{'A' * 43}"
    assert_problem(whoami(api.url, wrong), 401, "unauthorized")


def test_an_expiry_out_of_range_is_a_422(api: Api) -> None:
    admin = api.client("admin")
    for bad in (0, -5, 3650 * 86400 + 1, "30d", 1.5):
        answer = admin.post("/tokens", json={"name": "x", "admin": True, "expires_in": bad})
        assert_problem(answer, 422, "invalid_input")


def test_durations_read_as_people_write_them() -> None:
    assert [parse_duration(t) for t in ("45s", "15m", "12h", "30d", "2w", "90")] == [
        45, 900, 43200, 2592000, 1209600, 90]
    for bad in ("", "30 days", "3d4h", "-1d", "²d", "1y"):
        with pytest.raises(Exception, match="must be a number and a unit"):
            parse_duration(bad)


# --- last use --------------------------------------------------------------------------------------------------


def test_last_use_is_recorded_at_most_once_a_minute_per_token(any_api: Api) -> None:
    admin = any_api.client("admin")
    viewer_id = any_api.token_ids["alpha-viewer"]
    assert admin.get(f"/tokens/{viewer_id}").json()["last_used_at"] is None
    assert any_api.client("alpha-viewer").get("/whoami").status_code == 200
    key = f"{USE_KEY_PREFIX}{viewer_id}"
    first = any_api.store.last_used([key])[key]
    seen = admin.get(f"/tokens/{viewer_id}").json()["last_used_at"]
    assert seen is not None and seen.startswith(time.strftime("%Y-%m-%dT", time.gmtime(first)))
    viewer = any_api.client("alpha-viewer")
    for _ in range(5):
        assert viewer.get("/whoami").status_code == 200
    assert any_api.store.last_used([key])[key] == first  # no write per request
    listed = {t["token_id"]: t for t in admin.get("/tokens").json()["tokens"]}
    assert listed[viewer_id]["last_used_at"] == seen
    assert listed[any_api.token_ids["beta-operator"]]["last_used_at"] is None


def test_a_guard_writes_a_use_again_once_its_interval_passed(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "use.db") as store:
        _info, secret = create_token(store, "t", admin=True)
        guard = AuthGuard(store, use_interval=0.2)
        caller = guard.authenticate("10.0.0.1", f"Bearer {secret}")
        key = f"{USE_KEY_PREFIX}{caller.token_id}"
        first = store.last_used([key])[key]
        guard.authenticate("10.0.0.1", f"Bearer {secret}")
        assert store.last_used([key])[key] == first
        time.sleep(0.25)
        guard.authenticate("10.0.0.1", f"Bearer {secret}")
        assert store.last_used([key])[key] > first


# --- rotation --------------------------------------------------------------------------------------------------


def test_rotation_gives_a_new_secret_and_the_old_one_stops_at_once(api: Api) -> None:
    admin = api.client("admin")
    token_id, old = api.token_ids["alpha-editor"], api.tokens["alpha-editor"]
    rotated = admin.post(f"/tokens/{token_id}/rotate", json={}, headers={"Idempotency-Key": "r" * 32})
    assert rotated.status_code == 200, rotated.text
    new = rotated.json()["secret"]
    assert new.startswith(f"jixu_{token_id}_") and new != old
    assert rotated.json()["token"]["rotated_at"] is not None
    assert whoami(api.url, new).status_code == 200
    assert_problem(whoami(api.url, old), 401, "unauthorized")
    again = admin.post(f"/tokens/{token_id}/rotate", json={}, headers={"Idempotency-Key": "r" * 32})
    assert again.status_code == 200 and again.json()["secret"] is None  # a replay: nothing rotated, no secret
    assert whoami(api.url, new).status_code == 200


def test_rotation_with_a_grace_period_keeps_the_old_secret_for_that_long(api: Api) -> None:
    admin = api.client("admin")
    token_id, old = api.token_ids["alpha-viewer"], api.tokens["alpha-viewer"]
    new = admin.post(f"/tokens/{token_id}/rotate", json={"grace_seconds": 1}).json()["secret"]
    assert whoami(api.url, old).status_code == 200 and whoami(api.url, new).status_code == 200
    time.sleep(1.2)
    assert_problem(whoami(api.url, old), 401, "unauthorized")
    assert whoami(api.url, new).status_code == 200


def test_a_revoked_token_cannot_be_rotated_and_only_admins_rotate(api: Api) -> None:
    admin = api.client("admin")
    token_id = api.token_ids["beta-operator"]
    assert_problem(api.client("alpha-operator").post(f"/tokens/{token_id}/rotate", json={}), 403, "forbidden")
    admin.post(f"/tokens/{token_id}/revoke", json={})
    assert_problem(admin.post(f"/tokens/{token_id}/rotate", json={}), 409, "token_revoked")
    assert_problem(admin.post(f"/tokens/{token_id}/rotate", json={"grace_seconds": 8 * 86400}), 422, "invalid_input")


def test_the_last_admin_token_that_works_is_not_revoked_over_the_api(api: Api) -> None:
    """An audit's fuzzer revoked its own, and only, admin token: every request after was 401 and only the store's
    holder could make a new one. Over the API the last admin token that works is refused (409); with another
    admin token made first, it is revoked."""
    admin = api.client("admin")
    own = api.token_ids["admin"]
    assert_problem(admin.post(f"/tokens/{own}/revoke", json={}), 409, "last_admin_token")
    assert admin.get("/tokens").status_code == 200, "nothing was revoked"
    made = admin.post("/tokens", json={"name": "second-admin", "admin": True})
    assert made.status_code == 201, made.text
    second = made.json()["token"]["token_id"]
    assert admin.post(f"/tokens/{own}/revoke", json={}).json()["revoked"] is True
    assert_problem(admin.get("/tokens"), 401, "unauthorized")
    assert [t.token_id for t in list_tokens(api.store) if t.admin and not t.revoked] == [second]


def _jixu(*args: str) -> subprocess.CompletedProcess[str]:
    return run_jixu(*args, cwd=ROOT)


def test_the_cli_makes_expiring_tokens_lists_their_use_and_rotates_them(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    made = _jixu("tokens", "create", "--store", url, "--project", "alpha", "--role", "viewer", "--expires-in", "30d",
                 "--json")
    assert made.returncode == 0, made.stderr
    record = json.loads(made.stdout)["token"]
    lifetime = time.mktime(time.strptime(record["expires_at"][:19], "%Y-%m-%dT%H:%M:%S")) - time.mktime(
        time.strptime(record["created_at"][:19], "%Y-%m-%dT%H:%M:%S"))
    assert abs(lifetime - 30 * 86400) < 5
    bad = _jixu("tokens", "create", "--store", url, "--admin", "--expires-in", "soon")
    assert bad.returncode == 6 and "must be a number and a unit" in bad.stderr
    rotated = _jixu("tokens", "rotate", record["token_id"], "--store", url, "--grace", "1h", "--json")
    assert rotated.returncode == 0, rotated.stderr
    assert json.loads(rotated.stdout)["secret"].startswith(f"jixu_{record['token_id']}_")
    listed = _jixu("tokens", "list", "--store", url, "--json")
    [row] = json.loads(listed.stdout)
    assert row["expires_at"] == record["expires_at"] and row["rotated_at"] and row["last_used_at"] is None
    table = _jixu("tokens", "list", "--store", url)
    assert "expires" in table.stdout and "last used" in table.stdout and record["expires_at"][:10] in table.stdout


# --- rate limiting ---------------------------------------------------------------------------------------------


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[tuple[str, Store, dict[str, str]]]:
    store = SQLiteStore(tmp_path / "limited.db")
    secrets: dict[str, str] = {}
    for name in ("admin", "bystander"):
        info, secrets[name] = create_token(store, name, admin=True)
        secrets[f"{name}-id"] = info.token_id
    server = LiveServer(create_app(store, routers=[studio_router()],
                                   failed_auth_limit=FailureLimit(burst=3, per_minute=30)))
    server.start()
    try:
        yield server.url, store, secrets
    finally:
        server.stop()
        store.close()


def test_failed_authentication_is_limited_with_a_429_and_retry_after(
        limited: tuple[str, Store, dict[str, str]]) -> None:
    url, _store, secrets = limited
    assert whoami(url, secrets["bystander"]).status_code == 200  # at work before the attack
    wrong = f"jixu_{secrets['admin-id']}_{'B' * 43}"
    for _ in range(3):
        assert_problem(whoami(url, wrong), 401, "unauthorized")
    refused = whoami(url, wrong)
    body = assert_problem(refused, 429, "too_many_failed_logins")
    assert refused.headers["content-type"] == "application/problem+json"
    assert int(refused.headers["Retry-After"]) == body["retry_after"] >= 1
    # The right secret is refused too while limited (else the limit would not slow guessing), except for the
    # caller that was already at work from this address: it answers only for its own failures.
    assert_problem(whoami(url, secrets["admin"]), 429, "too_many_failed_logins")
    assert whoami(url, secrets["bystander"]).status_code == 200
    # No credential at all is no guess: a plain 401 (and counts nothing).
    assert_problem(httpx.get(f"{url}/api/v1/whoami"), 401, "unauthorized")
    time.sleep(2.1)  # 30 a minute: one more try every 2 s
    assert whoami(url, secrets["admin"]).status_code == 200


def test_guesses_at_a_trusted_token_from_its_own_address_are_limited_too(
        limited: tuple[str, Store, dict[str, str]]) -> None:
    url, _store, secrets = limited
    assert whoami(url, secrets["admin"]).status_code == 200
    wrong = f"jixu_{secrets['admin-id']}_{'H' * 43}"
    for _ in range(3):
        assert_problem(whoami(url, wrong), 401, "unauthorized")
    assert_problem(whoami(url, wrong), 429, "too_many_failed_logins")


def test_the_studio_login_is_limited_like_the_api(limited: tuple[str, Store, dict[str, str]]) -> None:
    url, _store, secrets = limited
    with httpx.Client(base_url=url, follow_redirects=False) as browser:
        # A browser form: every refusal answers 303 to the login page, which says why (Post/Redirect/Get).
        for _ in range(3):
            failed = browser.post("/studio/login", data={"token": f"jixu_{secrets['admin-id']}_{'D' * 43}"})
            assert failed.status_code == 303 and "jixu_studio" not in failed.cookies
            assert "too many failed" not in browser.get(failed.headers["location"]).text
        refused = browser.post("/studio/login", data={"token": secrets["bystander"]})
        assert refused.status_code == 303 and "jixu_studio" not in refused.cookies
        assert "too many failed" in browser.get(refused.headers["location"]).text


def test_buckets_count_by_address_and_by_token_id(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "guard.db") as store:
        target, secret = create_token(store, "target", admin=True)
        other, other_secret = create_token(store, "other", admin=True)
        guard = AuthGuard(store, per_address=FailureLimit(2, 1), per_token=FailureLimit(3, 1))
        for address in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):  # a guesser that moves between addresses
            with pytest.raises(HTTPProblem) as failed:
                guard.authenticate(address, f"Bearer jixu_{target.token_id}_{'E' * 43}")
            assert failed.value.status == 401
        with pytest.raises(HTTPProblem) as limited_id:  # the token id's bucket is empty, from anywhere
            guard.authenticate("10.0.0.4", f"Bearer {secret}")
        assert limited_id.value.status == 429
        assert guard.authenticate("10.0.0.4", f"Bearer {other_secret}").token_id == other.token_id
        for _ in range(2):
            with pytest.raises(HTTPProblem):
                guard.authenticate("10.0.0.5", f"Bearer jixu_{other.token_id}_{'F' * 43}")
        with pytest.raises(HTTPProblem) as limited_address:  # that address's bucket is empty, for any token
            guard.authenticate("10.0.0.5", f"Bearer jixu_{target.token_id}_{'G' * 43}")
        assert limited_address.value.status == 429 and limited_address.value.headers["Retry-After"] == "60"
        assert guard.authenticate("10.0.0.4", f"Bearer {other_secret}").token_id == other.token_id


# --- Studio sessions -------------------------------------------------------------------------------------------


@dataclass
class Pair:
    """Two servers over one store (two store objects, as two processes would have)."""

    urls: list[str]
    stores: list[Store]
    admin: str
    admin_id: str


def _studio_pair(stores: list[Store], **options: Any) -> tuple[Pair, list[LiveServer]]:
    info, secret = create_token(stores[0], "root", admin=True)
    servers = [LiveServer(create_app(store, routers=[studio_router()], **options)) for store in stores]
    for server in servers:
        server.start()
    return Pair([s.url for s in servers], stores, secret, info.token_id), servers


@pytest.fixture(params=["sqlite", "postgres"])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    schema: PostgresSchema | None = None
    if request.param == "postgres":
        from jixu.ledger import PostgresStore

        schema = PostgresSchema(request.getfixturevalue("postgres_dsn"))
        stores: list[Store] = [PostgresStore(schema.url, max_size=4), PostgresStore(schema.url, max_size=4)]
    else:
        stores = [SQLiteStore(tmp_path / "pair.db"), SQLiteStore(tmp_path / "pair.db")]
    made, servers = _studio_pair(stores)
    try:
        yield made
    finally:
        for server in servers:
            server.stop()
        for store in stores:
            store.close()
        if schema is not None:
            schema.drop()


def login(url: str, secret: str) -> str:
    """Log in through the Studio's form; the session cookie's value."""
    with httpx.Client(base_url=url, follow_redirects=False) as browser:
        answer = browser.post("/studio/login", data={"token": secret, "next": "/studio/threads"})
        assert answer.status_code == 303, answer.text
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert "Max-Age=" in cookie
        return str(browser.cookies[COOKIE])


def studio_get(url: str, session_id: str, path: str = "/studio/threads") -> httpx.Response:
    return httpx.get(f"{url}{path}", cookies={COOKIE: session_id}, follow_redirects=False)


def logout(url: str, session_id: str) -> None:
    page = studio_get(url, session_id)
    csrf = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page.text)
    assert csrf is not None, page.text[:500]
    answer = httpx.post(f"{url}/studio/logout", data={"csrf_token": csrf.group(1)}, cookies={COOKIE: session_id},
                        follow_redirects=False)
    assert answer.status_code == 303


def test_the_cookie_holds_an_opaque_session_id_that_every_server_over_the_store_knows(pair: Pair) -> None:
    session_id = login(pair.urls[0], pair.admin)
    assert pair.admin not in session_id and pair.admin_id not in session_id and len(session_id) == 43
    stored = pair.stores[1].get_session(session_key(session_id))
    assert stored is not None and stored.active and stored.subject == pair.admin_id
    assert stored.key.startswith(SESSION_KEY_PREFIX) and session_id not in stored.key  # only a digest is kept
    assert studio_get(pair.urls[1], session_id).status_code == 200  # the other server sees it
    assert studio_get(pair.urls[1], "x" * 43).status_code == 303  # an unknown id is not a session
    assert studio_get(pair.urls[1], pair.admin).status_code == 303  # the bearer token is not a cookie


def test_logout_on_one_server_ends_the_session_on_every_server(pair: Pair) -> None:
    session_id = login(pair.urls[0], pair.admin)
    other = login(pair.urls[0], pair.admin)
    logout(pair.urls[1], session_id)
    for url in pair.urls:
        assert studio_get(url, session_id).status_code == 303  # sent again, the old cookie is refused
    assert studio_get(pair.urls[0], other).status_code == 200  # another session of the token goes on


def test_revoking_or_rotating_the_token_ends_its_sessions(pair: Pair) -> None:
    info, secret = create_token(pair.stores[0], "studio-user", roles={"alpha": "viewer"})
    admin = {"Authorization": f"Bearer {pair.admin}"}
    first = login(pair.urls[0], secret)
    assert studio_get(pair.urls[1], first).status_code == 200
    rotated = httpx.post(f"{pair.urls[1]}/api/v1/tokens/{info.token_id}/rotate", json={"grace_seconds": 3600},
                         headers=admin).json()["secret"]
    assert studio_get(pair.urls[0], first).status_code == 303
    second = login(pair.urls[0], rotated)
    assert studio_get(pair.urls[1], second).status_code == 200
    httpx.post(f"{pair.urls[1]}/api/v1/tokens/{info.token_id}/revoke", json={}, headers=admin)
    assert studio_get(pair.urls[0], second).status_code == 303
    assert not pair.stores[0].get_session(session_key(second)).active  # type: ignore[union-attr]


def test_a_session_expires_after_the_servers_session_ttl(tmp_path: Path) -> None:
    stores: list[Store] = [SQLiteStore(tmp_path / "ttl.db")]
    made, servers = _studio_pair(stores, session_ttl=1)
    try:
        session_id = login(made.urls[0], made.admin)
        assert studio_get(made.urls[0], session_id).status_code == 200
        time.sleep(1.2)
        assert studio_get(made.urls[0], session_id).status_code == 303
    finally:
        servers[0].stop()
        stores[0].close()


# --- a token whose stream does not verify ----------------------------------------------------------------------


def _raw_target(api: Api, tmp_path: Path) -> str:
    url = api.store.url or ""
    return str(tmp_path / "api.db") if url.startswith("sqlite") else url


def test_a_token_edited_in_the_database_authenticates_nobody_and_is_listed_corrupt(any_api: Api,
                                                                                  tmp_path: Path) -> None:
    from tests.attacker import Raw

    admin = any_api.client("admin")
    made = admin.post("/tokens", json={"name": "reader", "roles": {"alpha": "viewer"}})
    revoked = admin.post("/tokens", json={"name": "gone", "roles": {"alpha": "editor"}})
    assert made.status_code == revoked.status_code == 201
    reader, gone = made.json(), revoked.json()
    assert admin.post(f"/tokens/{gone['token']['token_id']}/revoke", json={}).status_code == 200
    assert_problem(whoami(any_api.url, gone["secret"]), 401, "unauthorized")
    with Raw(_raw_target(any_api, tmp_path)).transaction() as run:
        # A viewer made an admin (its hash not recomputed), and a revocation changed into another event.
        run("UPDATE jixu_events SET data = replace(data, '\"kind\":\"project\"', '\"kind\":\"admin\"') "
            "WHERE stream = ?", f"auth/token/{reader['token']['token_id']}")
        run("UPDATE jixu_events SET type = 'token.noted' WHERE stream = ? AND seq = 2",
            f"auth/token/{gone['token']['token_id']}")
    # Seq 1 is bad: nothing of the token verifies, so its secret is nobody's and the caller is told nothing more.
    assert_problem(whoami(any_api.url, reader["secret"]), 401, "unauthorized")
    assert_problem(httpx.post(f"{any_api.url}/api/v1/tokens", json={"name": "mallory", "admin": True},
                              headers={"Authorization": f"Bearer {reader['secret']}"}), 401, "unauthorized")
    # Seq 2 is bad: the token as created verifies, its secret holder is told why it no longer works.
    body = assert_problem(whoami(any_api.url, gone["secret"]), 401, "token_corrupt")
    assert body["first_bad_seq"] == 2 and body["reason"] == "payload_changed"
    listed = {t["token_id"]: t for t in admin.get("/tokens").json()["tokens"]}
    bad_reader = listed[reader["token"]["token_id"]]
    assert bad_reader["corruption"]["first_bad_seq"] == 1 and bad_reader["kind"] == "project"
    assert bad_reader["roles"] == {} and bad_reader["name"] == ""  # nothing unverified is shown as the token's
    bad_gone = listed[gone["token"]["token_id"]]
    assert bad_gone["corruption"]["first_bad_seq"] == 2 and bad_gone["name"] == "gone"
    assert listed[any_api.token_ids["admin"]]["corruption"] is None
    assert "mallory" not in {t["name"] for t in listed.values()}
    one = admin.get(f"/tokens/{gone['token']['token_id']}").json()
    assert one["corruption"]["reason"] == "payload_changed"
    # Nothing is appended to a broken stream: neither rotated nor revoked.
    for action in ("rotate", "revoke"):
        refused = assert_problem(admin.post(f"/tokens/{gone['token']['token_id']}/{action}", json={}), 409,
                                 "token_corrupt")
        assert refused["first_bad_seq"] == 2
    assert any_api.store.stream_info(f"auth/token/{gone['token']['token_id']}").head_seq == 2


def test_the_cli_lists_a_token_whose_stream_does_not_verify_as_corrupt(tmp_path: Path) -> None:
    from tests.attacker import Raw, flip_data_byte

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    made = _jixu("tokens", "create", "--store", url, "--project", "alpha", "--role", "viewer", "--json")
    token_id = json.loads(made.stdout)["token"]["token_id"]
    flip_data_byte(Raw(tmp_path / "cli.db"), f"auth/token/{token_id}", 1)
    [row] = json.loads(_jixu("tokens", "list", "--store", url, "--json").stdout)
    assert row["corruption"]["first_bad_seq"] == 1
    table = _jixu("tokens", "list", "--store", url)
    assert table.returncode == 0 and "corrupt" in table.stdout
    refused = _jixu("tokens", "revoke", token_id, "--store", url)
    assert refused.returncode != 0 and "corrupt" in refused.stderr


def test_two_admins_revoking_each_other_at_once_leave_one_working(store: Store) -> None:
    """Found by a review: the last-admin check read the tokens, then recorded the revocation; two admins revoking
    each other at the same moment each saw the other working, and both were revoked (29 of 30 tries). The check
    and the revocation now hold one guard (a lease), and the revocation is fenced by it."""
    from concurrent.futures import ThreadPoolExecutor

    from jixu.server.auth import LastAdminToken, revoke_token

    for trial in range(8):
        first, _ = create_token(store, f"first-{trial}", admin=True)
        second, _ = create_token(store, f"second-{trial}", admin=True)
        barrier = threading.Barrier(2)

        def revoke(token_id: str, barrier: threading.Barrier = barrier) -> str:
            barrier.wait(5)
            try:
                revoke_token(store, token_id, actor="race", keep_an_admin=True)
            except LastAdminToken:
                return "refused"
            return "revoked"

        with ThreadPoolExecutor(2) as pool:
            outcomes = sorted(pool.map(revoke, [first.token_id, second.token_id]))
        working = [t.token_id for t in list_tokens(store) if t.admin and not t.revoked]
        assert outcomes == ["refused", "revoked"] and len(working) == 1, (trial, outcomes, working)
        revoke_token(store, working[0], actor="cleanup")  # as `jixu tokens revoke` on the store may: none works
