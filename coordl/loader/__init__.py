"""The loader room: coordl.DataLoader, its DALI backend, iterators, epoch order, resume, counters and caches."""
