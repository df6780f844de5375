"""Drives the PyPI meta-memcache client, unchanged, against one address and
prints one JSON line per operation. tests/integration/meta_ring.rs runs it against a plain
memcached and then through memring and compares the lines.

Usage: python3 meta_memcache_check.py HOST:PORT
"""

import json
import sys

from meta_memcache import (
    CacheClient,
    Key,
    LeasePolicy,
    ServerAddress,
    connection_pool_factory_builder,
)


def main() -> None:
    host, port = sys.argv[1].rsplit(":", 1)
    cache = CacheClient.cache_client_from_servers(
        servers=[ServerAddress(host=host, port=int(port))],
        connection_pool_factory_fn=connection_pool_factory_builder(recv_timeout=5),
    )
    out = []

    def record(name, value):
        out.append(json.dumps([name, value], sort_keys=True, default=repr))

    keys = [f"client:{i}" for i in range(60)]
    # Unicode and over-long keys: the client sends them as base64 (`b`).
    keys += ["clé:été", "ключ", "k" * 300]
    for i, key in enumerate(keys):
        record("set", cache.set(key=key, value={"n": i, "s": "v" * (i % 7)}, ttl=300))
    for key in keys[:5] + keys[-3:]:
        record("get", cache.get(key=key))
    got = cache.multi_get(keys=keys + ["absent:1", "absent:2"])
    record("multi_get", sorted((k.key, v) for k, v in got.items()))
    record("delete", cache.delete(key=keys[0]))
    record("delete_again", cache.delete(key=keys[0]))
    record("get_deleted", cache.get(key=keys[0]))
    record("touch", cache.touch(key=keys[1], ttl=100))
    record("touch_missing", cache.touch(key="absent:3", ttl=100))
    value, cas = cache.get_cas(key=keys[2])
    record("get_cas", value)
    record("set_stale_cas", cache.set(key=keys[2], value="x", ttl=60, cas_token=(cas or 0) + 1000))
    record("set_cas", cache.set(key=keys[2], value="y", ttl=60, cas_token=cas))
    record("after_cas", cache.get(key=keys[2]))
    record("delta_missing", cache.delta(key="counter", delta=1))
    record("delta_init", cache.delta_initialize_and_get(key="counter", delta=5, initial_value=10, initial_ttl=60))
    record("delta", cache.delta_and_get(key="counter", delta=7))
    record("delta_noreply", cache.delta(key="counter", delta=1, no_reply=True))
    record("counter", cache.delta_and_get(key="counter", delta=0))
    policy = LeasePolicy(ttl=30, miss_retries=1, miss_retry_wait=0.01)
    record("lease_first", cache.get_or_lease(key="leased", lease_policy=policy))
    record("lease_second", cache.get_or_lease(key="leased", lease_policy=policy))
    record("lease_fill", cache.set(key="leased", value="filled", ttl=60))
    record("lease_after", cache.get_or_lease(key="leased", lease_policy=policy))
    record("set_noreply", cache.set(key=keys[3], value="quiet", ttl=60, no_reply=True))
    record("get_after_noreply", cache.get(key=keys[3]))
    print("\n".join(out))


if __name__ == "__main__":
    main()
