"""Coordinated prep: one daemon prepares each batch for every job on the server.

    coordl serve --data DIR --batch-size 256 --socket /run/user/1000/coordl.sock
    loader = coordl.DataLoader(coordl.ImageFolder(DIR), batch_size=256, shuffle=True,
                               coordinator="unix:///run/user/1000/coordl.sock")

A batch is prepared once for all the jobs that are in step; a job resumed
behind the ring gets the batches it lacks prepared again (client.py).

The pure parts (no I/O, tested without processes):

    config.py     `coordl serve`'s settings, validated; the socket address
    plan.py       epoch order, batches, where a late joiner starts, its epochs
    protocol.py   length-prefixed msgpack messages, validated (never pickle); `Failure`
    hello.py      may a job attach (every setting that changes a batch checked)
    scheduler.py  who gets which batch when; the join window; production; stragglers

The shells (processes, sockets, shared memory):

    segments.py   shared-memory names (a prefix per daemon) and lifetime
    ring.py       the K slots: layout, states and their legal transitions, holders
    workers.py    prep worker processes that decode straight into a slot
    daemon.py     `coordl serve`: sockets, signals, processes, segments
    channel.py    a socket to the daemon; `coordl status` (no torch)
    client.py     the job's side, used by coordl.DataLoader(coordinator=...)
    assemble.py   a job of its own batch size: its batches cut from the daemon's chunks
    cleanup.py    what a killed daemon left behind (part of `coordl cleanup`)
"""
