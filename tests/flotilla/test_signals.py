"""A long-running command's signals, on a process of its own: SIGUSR1 logs where each
task and thread waits and leaves the command running; SIGTERM then stops it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

COMMAND = """
import asyncio, logging, threading
from flotilla.signals import stop_event

async def waiting_for_a_reply():
    await asyncio.Event().wait()

async def main():
    stop = stop_event()
    stuck = asyncio.create_task(waiting_for_a_reply(), name="stuck-reply")
    print("ready", flush=True)
    await stop.wait()
    print("stopped", not stuck.done(), flush=True)

logging.basicConfig(level=logging.WARNING)
threading.Thread(target=threading.Event().wait, name="held-thread", daemon=True).start()
asyncio.run(main())
"""


def test_sigusr1_logs_where_each_task_and_thread_waits_and_stops_nothing() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", COMMAND],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.5)  # the dump is logged before the stop below is seen
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out == "stopped True\n"  # the dump stopped nothing
    assert "tasks, on SIGUSR1" in err
    assert "stuck-reply" in err and "waiting_for_a_reply" in err
    assert "Thread held-thread" in err and "Thread MainThread" in err
