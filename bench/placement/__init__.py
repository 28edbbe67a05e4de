"""`flotilla bench placement`: on-demand models placed by the shared queue across worker
processes, against a fixed assignment of the same models (``run``)."""
