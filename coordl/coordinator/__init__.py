"""Coordinated prep: one daemon prepares each batch once for every job on the server.

    coordl serve --data DIR --batch-size 256 --socket /run/user/1000/coordl.sock
    loader = coordl.DataLoader(coordl.ImageFolder(DIR), batch_size=256, shuffle=True,
                               coordinator="unix:///run/user/1000/coordl.sock")

Modules, in the order data moves through them:

    plan.py       pure: epoch order, batches, where a late joiner starts, its epochs
    protocol.py   length-prefixed msgpack messages, validated (never pickle)
    hello.py      pure: may a job attach (every setting that changes a batch checked)
    segments.py   shared-memory names (a prefix per daemon) and lifetime
    ring.py       the K slots: layout, states and their legal transitions, holders
    scheduler.py  who gets which batch when; the join window; production; stragglers (no I/O)
    workers.py    prep worker processes that decode straight into a slot
    daemon.py     `coordl serve`: sockets, signals, processes, segments
    client.py     the job's side, used by coordl.DataLoader(coordinator=...)
    cleanup.py    what a killed daemon left behind (`coordl cleanup`)
"""
