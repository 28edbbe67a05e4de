"""The HTTP front: annotates requests and drops them into the shared queue.

Never imports torch (a test holds it to that)."""
