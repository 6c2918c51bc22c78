"""cache/partitioned/recycle.py: a pooled buffer is reused only once nothing refers to it, the pool holds at
most its capacity, and MGET values read into pooled buffers stay intact while they are held
(real redis-server)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import redis
import torch

from coordl.cache.partitioned import mgetread, recycle


@pytest.mark.filterwarnings("ignore:The given buffer is not writable")
def test_a_buffer_is_reused_only_when_no_view_holds_it():
    pool = recycle.BufferPool(capacity=10 * 2**20)
    a = pool.take(100_000)
    view = a.data[:100_000].toreadonly()
    del a
    b = pool.take(100_000)                  # `view` holds the first: a new one
    assert pool.made == 2 and pool.reused == 0
    arr = np.frombuffer(view, dtype=np.uint8)   # an array made from the view holds it too
    del view
    c = pool.take(50_000)
    assert pool.made == 3 and pool.reused == 0
    t = torch.frombuffer(arr, dtype=torch.uint8)
    del arr
    d = pool.take(90_000)
    assert pool.made == 4 and pool.reused == 0      # held by the torch tensor, through the array
    del t
    gc.collect()
    e = pool.take(100_000)                   # the first buffer, now free
    assert pool.reused == 1 and pool.made == 4
    assert e.nbytes >= 100_000
    del b, c, d, e


def test_the_pool_holds_at_most_its_capacity_and_lets_small_buffers_go():
    pool = recycle.BufferPool(capacity=1 * 2**20)
    held = [pool.take(250_000) for _ in range(5)]   # 281,250 -> 288 KiB each: 3 fit in 1 MiB
    assert pool.held_bytes == 3 * 288 * 2**10 and pool.made == 5
    del held
    small = pool.take(100_000)                  # a free 288 KiB buffer serves it
    assert pool.reused == 1 and small.nbytes == 288 * 2**10
    del small
    big = [pool.take(400_000) for _ in range(2)]   # the free ones are too small: let go for room
    assert all(b.nbytes >= 400_000 for b in big) and pool.made == 7
    assert pool.held_bytes <= 2**20 and pool.held_bytes >= 2 * 400_000


def test_a_forked_child_gets_its_own_pool(in_child):
    parent = recycle.process_pool()
    assert in_child(lambda: recycle.process_pool() is not parent) == 0
    assert recycle.process_pool() is parent


def test_mget_values_stay_intact_while_held_and_their_buffers_are_reused_after(redis_nodes, monkeypatch):
    monkeypatch.setattr(recycle, "_pool", recycle.BufferPool())   # not one earlier tests filled
    node = redis_nodes()
    client = redis.Redis.from_url(node.url, protocol=2, socket_timeout=5)
    conn = client.connection_pool.get_connection()
    rng = np.random.default_rng(11)
    values = {f"k{i}".encode(): rng.integers(0, 256, int(rng.integers(60_000, 140_000)), dtype=np.uint8).tobytes()
              for i in range(24)}
    client.mset(values)
    keys = list(values)
    pool = recycle.process_pool()

    def read(ks):
        conn.send_command("MGET", *ks)
        return mgetread.read_mget(conn)

    first = read(keys[:12])
    second = read(keys[12:])                 # while `first` is held: other buffers
    assert [bytes(v) for v in first] == [values[k] for k in keys[:12]]
    assert [bytes(v) for v in second] == [values[k] for k in keys[12:]]
    ids = {id(v.obj) for v in first} | {id(v.obj) for v in second}
    assert len(ids) == 24
    reused0 = pool.reused
    for _ in range(5):                       # let go, read again: the pooled buffers come back
        del first
        first = read(keys[::-1][:12])
        assert [bytes(v) for v in first] == [values[k] for k in keys[::-1][:12]]
        assert [bytes(v) for v in second] == [values[k] for k in keys[12:]]   # still intact
    assert pool.reused - reused0 >= 4 * 12
    client.connection_pool.release(conn)
    client.close()
