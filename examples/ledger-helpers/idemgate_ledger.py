"""Idempotent tool calls through `idemgate serve` (the ledger API). Python 3 standard library only.

    ledger = Ledger("http://127.0.0.1:8787", token=None)
    with ledger.call(turn_id, "create_ticket", {"title": "printer on fire"}) as c:
        if c.replayed:
            return c.outcome["result"]   # the first call's result; nothing ran again
        ticket = create_ticket(...)      # the side effect, at most once
        c.complete(ticket)               # stored before this returns

While the block runs, a background thread heartbeats every lease/3, so a call longer than the
lease (default 30 s) stays in progress and a retry waits for it instead of taking it over.
Leaving the block without complete() releases the record (nothing happened). An exception marks
it unknown (the action may have happened; retries get an "outcome unknown" error until someone
resolves it) unless it is a NotSent, which releases it. Conditions (still in progress, outcome
unknown, drift, store down) raise LedgerError with the RFC 9457 problem the server sent.
"""
import json
import threading
import urllib.error
import urllib.request


class LedgerError(Exception):
    def __init__(self, status, problem):
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', problem)}")
        self.status, self.problem = status, problem
        self.type = problem.get("type", "").rsplit("/", 1)[-1]  # "in-progress", "drift", ...


class NotSent(Exception):
    """Raise inside the block when the action certainly did not happen: the record is released."""


class Ledger:
    def __init__(self, url, token=None, timeout=60):
        self.url, self.token, self.timeout = url.rstrip("/"), token, timeout

    def post(self, path, body):
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as res:
                return json.loads(res.read())
        except urllib.error.HTTPError as e:
            raise LedgerError(e.code, json.loads(e.read() or b"{}")) from None

    def call(self, turn_id, tool, args=None, key=None):
        return Call(self, {"turn_id": turn_id, "tool": tool, "args": args or {}, "key": key})


class Call:
    def __init__(self, ledger, begin):
        self.ledger, self.begin, self.done = ledger, begin, False

    def __enter__(self):
        d = self.ledger.post("/v1/calls/begin", {k: v for k, v in self.begin.items() if v is not None})
        self.replayed, self.outcome = d["decision"] == "replay", d.get("outcome")
        self.attached, self.key, self.fence = d.get("attached", False), d.get("key"), d.get("fence")
        self.done = self.replayed or d.get("unguarded", False)  # nothing to report back
        self._stop = threading.Event()
        self._beats = None
        if not self.done and d.get("lease_ms"):
            self._beats = threading.Thread(target=self._heartbeats, args=(d["lease_ms"] / 3000,),
                                           daemon=True)
            self._beats.start()
        return self

    def _heartbeats(self, every):
        # Until the block ends. A refused heartbeat (lease lost, outcome unknown) ends them: the
        # record is no longer this call's to keep; complete() still stores what it did at its fence.
        while not self._stop.wait(every):
            try:
                self._step("heartbeat")
            except LedgerError as e:
                if e.status != 503:
                    return
            except OSError:
                pass  # the server is unreachable: try again at the next beat

    def _stop_beats(self):
        if self._beats is not None:
            self._stop.set()
            self._beats.join()
            self._beats = None

    def _step(self, step, **extra):
        return self.ledger.post(f"/v1/calls/{step}", {"key": self.key, "fence": self.fence, **extra})

    def heartbeat(self):  # sent by itself every lease/3 while the block runs
        return self._step("heartbeat")

    def complete(self, result, status="success"):
        self.outcome = {"status": status, "result": result}
        self._stop_beats()
        if not self.done:
            self.done = True  # even if it fails: never mark unknown what may be stored
            self._step("complete", outcome=self.outcome)

    def __exit__(self, exc_type, exc, tb):
        self._stop_beats()
        if not self.done:
            self.done = True
            self._step("mark_unknown" if exc and not isinstance(exc, NotSent) else "release")
        return False
