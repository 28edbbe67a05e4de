"""flotilla: serve fleets of small models through a shared queue and pulling workers."""

__version__ = "0.1.0"
