"""ground.workers: a server in several processes, for the bench. A reader of the lesson need
not open it: no scenario, test of a claim or pool uses it.

    Workers   a mixin: Workers + any ground.server.Server subclass, made with workers=N, runs
              N processes, each a copy of the server listening on the same port (SO_REUSEPORT:
              the kernel deals connections out among them), so a relay uses every core; each
              process counts its own share of the counters
"""
import os
import signal
import sys

from ground.server import listener


class Workers:
    """workers=N copies of the server it is mixed into (see the module's map); close() ends
    the other processes and waits for them."""

    def __init__(self, *args, workers=1, **options):
        self.workers = workers
        self.reuse_port = workers > 1
        self._worker_pids = []   # the other workers' processes, ended by close()
        super().__init__(*args, **options)

    def start_accepting(self):
        """Fork the other workers before any thread of this one accepts: a fork copies only
        the thread that calls it, and would copy a lock another thread held."""
        for _ in range(self.workers - 1):
            self._start_worker()
        super().start_accepting()

    def _start_worker(self):
        """Fork a process that accepts on a listener of its own, on the same port, until close()
        sends it SIGTERM; it then closes as this server does."""
        if pid := os.fork():
            self._worker_pids.append(pid)
            return
        try:
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # wakes accept(); close() below
            self._listener.close()
            self._listener = listener(self.addr, reuse_port=True)
            self._worker_pids = []
            self._accept_loop()
        finally:
            self.close()
            os._exit(0)

    def close(self):
        super().close()
        pids, self._worker_pids = self._worker_pids, []   # a second close() has none to end
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
