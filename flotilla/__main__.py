"""``python -m flotilla`` and the ``flotilla`` command.

SIGTERM is a clean exit from the first line on: importing the CLI takes a few tenths
of a second, and a supervisor that stops a process still importing should see status
0, not a death by the signal. Commands replace the handler once they hold work. The
allocator's heaps are limited next, before any import starts a thread (it counts only
then): what an evicted model frees goes back to the system.
"""

from flotilla.signals import exit_cleanly_until_running


def main() -> None:
    exit_cleanly_until_running()
    from embedder.residency.memory import limit_arenas

    limit_arenas()
    from flotilla.cli import app

    app()


if __name__ == "__main__":
    main()
