"""The pure parts of the store-login appliers (the rest runs against the real servers in
tests/integration/test_stack.py)."""

from __future__ import annotations

from services.contracts import etcd, keys
from services.schema import cql_roles, etcd_auth


def test_the_etcd_grant_covers_exactly_the_platforms_prefix() -> None:
    assert etcd.PREFIX == keys.ETCD_PREFIX
    end = etcd_auth.range_end(etcd.PREFIX.encode())
    assert end == b"/likes0"  # etcdctl --prefix: every key starting /likes/, nothing else
    inside = [b"/likes/", b"/likes/split/p1", b"/likes/\xff\xff"]
    outside = [b"/likes", b"/likes0", b"/likesx", b"/other/"]
    assert all(etcd.PREFIX.encode() <= k < end for k in inside)
    assert not any(etcd.PREFIX.encode() <= k < end for k in outside)
    assert etcd_auth.range_end(b"a\xff") == b"b"


def test_a_password_cannot_end_the_cql_string_it_is_quoted_in() -> None:
    assert cql_roles.quote("it's") == "'it''s'"
    assert cql_roles.quote("x' OR '1") == "'x'' OR ''1'"


def test_the_services_role_gets_data_permissions_only() -> None:
    assert set(cql_roles.SERVICE_PERMISSIONS) == {"SELECT", "MODIFY"}
    assert cql_roles.SERVICE_ROLE != cql_roles.ADMIN_ROLE != cql_roles.DEFAULT_SUPERUSER
