"""Cache node membership (issue 28 point 3): the node list is checked at connect, and a node added
or removed between epochs moves only that node's share; the rest stays cached. Real redis-servers."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from coordl.cache.partitioned import membership, redisnode
from coordl.cache.partitioned.cache import PartitionedCache
from coordl.cli.commands import main
from coordl.errors import ConfigError

FP = "beef" * 16
N = 400


def _items(n: int = N) -> list[bytes]:
    rng = np.random.default_rng(11)
    return [rng.integers(0, 256, size=300 + 7 * i % 200, dtype=np.uint8).tobytes() for i in range(n)]


def _cache(urls, rank: int = 0, **kw) -> PartitionedCache:
    return PartitionedCache(list(urls), rank, **kw).open(FP, N, "members")


def test_ranks_with_different_node_lists_are_refused_naming_the_difference(redis_nodes):
    a, b, c, d = (redis_nodes() for _ in range(4))
    first = _cache([a.url, b.url, c.url])
    with pytest.raises(ConfigError) as e:
        _cache([a.url, b.url, d.url], 1)
    msg = str(e.value)
    name_c, name_d = redisnode.node_name(c.url), redisnode.node_name(d.url)
    assert f"has {name_d}, which the node's list lacks" in msg
    assert f"has {name_c}, which this rank's nodes= lacks" in msg
    assert "membership='update'" in msg and "cache-node members --update" in msg
    with pytest.raises(ConfigError, match=f"has {name_c}, which this rank's nodes= lacks"):
        _cache([a.url, b.url], 0)                         # a subset is a different list too
    # the same list in another order and spelling is the same list
    again = _cache([c.url, b.url.replace("127.0.0.1", "localhost"), a.url.rstrip("/0")], 2)
    assert again.owner(17) == [2, 1, 0][first.owner(17)]
    for x in (first, again):
        x.close()


def test_a_bad_membership_value_or_key_is_refused(redis_nodes):
    a = redis_nodes()
    with pytest.raises(ConfigError, match="membership='sync'.*'check'.*'update'"):
        PartitionedCache([a.url], 0, membership="sync")
    a.client().hset(membership.MEMBERS_KEY, "x", "1")  # not coordl's
    with pytest.raises(ConfigError, match="coordl:members cannot be read or written.*delete it"):
        PartitionedCache([a.url], 0)


def _fill(cache: PartitionedCache, data: list[bytes]) -> None:
    for i, raw in enumerate(data):
        cache.put(i, raw)


def test_adding_a_node_moves_only_its_share_the_rest_stays_cached(redis_nodes):
    nodes = [redis_nodes() for _ in range(5)]
    urls = [n.url for n in nodes]
    data = _items()
    old = _cache(urls[:4])
    _fill(old, data)
    assert len(old.get_many(range(N))) == N
    owner_before = [urls[old.owner(i)] for i in range(N)]
    with pytest.raises(ConfigError, match="lacks"):
        _cache(urls, 0)                                    # not without saying so
    new = _cache(urls, 0, membership="update")
    owner_after = [urls[new.owner(i)] for i in range(N)]
    moved = [i for i in range(N) if owner_before[i] != owner_after[i]]
    assert all(owner_after[i] == urls[4] for i in moved)  # none between two old nodes
    assert 0.12 < len(moved) / N < 0.28, len(moved)      # about 1/5
    kept = [i for i in range(N) if i not in set(moved)]
    hits = new.get_many(kept)
    assert set(hits) == set(kept)                          # the rest stays cached
    assert all(bytes(v) == data[i] for i, v in hits.items())   # no wrong sample
    hits = new.get_many(range(N))                          # the moved ones: from their previous owner,
    assert len(hits) == N and all(bytes(v) == data[i] for i, v in hits.items())   # written to the new
    assert nodes[4].client().hget(new.meta_key, "items") == str(len(moved)).encode()   # (test_membership_moved)
    hits = new.get_many(range(N))
    assert len(hits) == N and all(bytes(v) == data[i] for i, v in hits.items())
    with pytest.raises(ConfigError, match="which the node's list lacks|which this rank's nodes= lacks"):
        _cache(urls[:4], 1)                                # a rank still on the old list is refused
    for n in nodes:
        assert membership.read(n.client()) == sorted(redisnode.node_name(u) for u in urls)
    old.close()
    new.close()
    print(f"4 -> 5 nodes: {len(moved)} of {N} items moved ({len(moved) / N:.3f}; 1/5 = 0.200)")


def test_removing_a_node_moves_only_its_items(redis_nodes):
    nodes = [redis_nodes() for _ in range(4)]
    urls = [n.url for n in nodes]
    data = _items()
    old = _cache(urls)
    _fill(old, data)
    theirs = {i for i in range(N) if old.owner(i) == 2}
    nodes[2].stop()
    rest = urls[:2] + urls[3:]
    new = _cache(rest, 0, membership="update")
    hits = new.get_many(range(N))
    assert set(hits) == set(range(N)) - theirs            # only the removed node's items are missing
    assert all(bytes(v) == data[i] for i, v in hits.items())
    assert 0.15 < len(theirs) / N < 0.35
    old.close()
    new.close()


def test_members_command_reads_and_updates(redis_nodes):
    nodes = [redis_nodes() for _ in range(3)]
    urls = [n.url for n in nodes]
    _cache(urls[:2]).close()
    run = CliRunner()
    r = run.invoke(main, ["cache-node", "members", *urls[:2]], catch_exceptions=False)
    assert r.exit_code == 0 and r.output.count("node list: same") == 2, r.output
    r = run.invoke(main, ["cache-node", "members", *urls], catch_exceptions=False)
    assert r.exit_code != 0 and "DIFFERS" in r.output and "no list yet" in r.output, r.output
    assert "--update" in r.output
    r = run.invoke(main, ["cache-node", "members", "--update", *urls], catch_exceptions=False)
    assert r.exit_code == 0 and "3 node(s) now belong" in r.output, r.output
    _cache(urls, 1).close()                                 # ranks with the new list connect
    with pytest.raises(ConfigError):
        _cache(urls[:2], 0)


def test_a_node_moved_to_another_list_under_a_running_job_is_a_fault_and_a_restarted_one_gets_its_record(
        redis_nodes, caplog):
    """Every new connection checks the record: a node whose list was rewritten while a job runs is
    skipped (kind 'members', its items from storage); a node restarted empty gets the record back."""
    a, b, c = (redis_nodes() for _ in range(3))
    data = _items()
    cache = _cache([a.url, b.url], retry_after=0.0)
    _fill(cache, data)
    on_b = {i for i in range(N) if cache.owner(i) == 1}
    b.stop()
    b.start()                                              # restarted: empty, no record
    assert len(cache.get_many(range(N))) == N - len(on_b)  # reconnects (and checks) b: empty now
    names = sorted(redisnode.node_name(u) for u in (a.url, b.url))
    assert membership.read(b.client()) == names            # the record is back
    _cache([b.url, c.url], 1, membership="update").close()  # another cluster takes b
    cache._clients[1].connection_pool.disconnect()
    assert set(cache.get_many(range(N))) == set(range(N)) - on_b
    faults = [r.getMessage() for r in caplog.records if "another node list" in r.getMessage()]
    assert len(faults) == 1 and redisnode.node_name(c.url) in faults[0] and "restart every rank" in faults[0]
    assert cache.stats()["node_faults"] == 1
    assert not any(cache.put(i, data[i]) for i in sorted(on_b))   # nothing written into the other list's node
    cache.close()
