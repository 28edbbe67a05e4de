"""Models resident on a device within its memory budget: loaded at start or on
demand, evicted least recently used."""
