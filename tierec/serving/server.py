"""``tierec serve``: an HTTP JSON server over a :class:`~tierec.serving.scorer.Scorer` (Starlette on uvicorn).

- ``POST /score`` with ``{"rows": [{"column": value, ...}, ...]}`` (the training
  file's column names and raw values; the label may be absent) answers
  ``{"scores": [...]}``, click probabilities in the rows' order;
- ``GET /health`` answers ``{"status": "ok"}`` once the export is loaded;
- ``GET /version`` names the export (its path, step, tierec version, precision),
  the step served now, and with ``--follow`` the run's full checkpoint and last
  delta taken up since (none: ``null``).

With ``--follow RUN_DIR`` a background task asks a
:class:`~tierec.serving.follow.RunFollower` every ``poll_s`` seconds (on a
worker thread) for what the run published since, and swaps the served scorer,
one reference, on the event loop: between two requests, never during one.

A bad request gets a 4xx status and ``{"error": "<one line>"}``, never a
traceback. It binds 127.0.0.1 unless told otherwise. Starlette, uvicorn (with
httptools, its C HTTP parser) and orjson (JSON in and out of /score) are an
optional extra (``pip install 'tierec[serve]'``); without them ``tierec serve``
stops with one line saying so. A request is scored on the event loop itself:
one request at a time, no thread hop (on 2 cores the fastest for small
requests, and the scorer's memory stays one request's), and the dense program
runs on ``threads`` torch threads (default 1: more gain nothing on a small
request, and their spin-waits take CPU from the HTTP and JSON work).

>>> EXTRA  # what ``tierec serve`` says, exit status 2, when the extra is missing
"tierec serve needs Starlette, uvicorn, httptools and orjson, the optional extra: pip install 'tierec[serve]'"

``build_app(Scorer.load(DIR))`` is the ASGI application, for any ASGI server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

from tierec.config import ConfigError
from tierec.serving.follow import RunFollower
from tierec.serving.inputs import BadRowsError
from tierec.serving.scorer import Scorer
from tierec.train.stopping import Interrupted
from tierec.version import tierec_version

MAX_BODY_BYTES = 64 << 20  # a request body larger than this is refused (413)
MAX_ROWS = 100_000  # rows in one request
SWITCH_S = 0.001  # the interpreter's thread switch interval while a follower may apply a delta
EXTRA = "tierec serve needs Starlette, uvicorn, httptools and orjson, the optional extra: pip install 'tierec[serve]'"


def _require_extra() -> None:
    try:
        import httptools  # noqa: F401
        import orjson  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError(EXTRA) from None


class Served:
    """The scorer being served: one reference, replaced whole by :meth:`swap` (on the event loop)."""

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer

    def swap(self, scorer: Scorer) -> None:
        self.scorer = scorer


async def follow_run(served: Served, follower: RunFollower, poll_s: float) -> None:
    """Every ``poll_s`` seconds: what the followed run published since, taken up off the event loop, then swapped in.
    A failure is one line on stderr (again only when it changes), and the server goes on serving what it has."""
    said = ""
    while True:
        try:
            newer = await asyncio.to_thread(follower.poll, served.scorer)
            said = ""
        except Exception as e:  # noqa: BLE001 - the server goes on serving what it has
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            line = f"tierec serve --follow: {type(e).__name__}: {first}; still serving step {served.scorer.origin.step}"
            if line != said:
                print(line, file=sys.stderr, flush=True)
            said, newer = line, None
        if newer is not None:
            served.swap(newer)
        await asyncio.sleep(poll_s)


def build_app(scorer: Scorer, follower: RunFollower | None = None, poll_s: float = 1.0) -> Any:
    """The ASGI application serving ``scorer``; with ``follower``, what its run publishes too."""
    _require_extra()
    import orjson
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": " ".join(message.split())[:500]}, status_code=status)

    async def score(request: Request) -> Response:
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > MAX_BODY_BYTES):
            return error(413, f"the body is larger than {MAX_BODY_BYTES:,} bytes; send fewer rows per request")
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            return error(413, f"the body is larger than {MAX_BODY_BYTES:,} bytes; send fewer rows per request")
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            return error(400, f"the body is not JSON ({e})")
        rows = payload.get("rows") if isinstance(payload, dict) else None
        if not isinstance(rows, list):
            return error(400, 'the body must be a JSON object {"rows": [{"column": value, ...}, ...]}')
        if len(rows) > MAX_ROWS:
            return error(413, f"{len(rows):,} rows in one request; at most {MAX_ROWS:,}")
        try:
            scores = served.scorer.score(rows)
        except BadRowsError as e:
            return error(400, str(e))
        except Exception as e:  # noqa: BLE001 - a request must never see a traceback
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return error(500, f"scoring failed: {type(e).__name__}: {first}")
        # float64 text of each float32 score, as json.dumps writes it (shortest round trip); NaN would be null
        return Response(orjson.dumps({"scores": scores.tolist()}), media_type="application/json")

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def version(request: Request) -> JSONResponse:
        return JSONResponse({**served.scorer.describe(), "server_tierec_version": tierec_version()})

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        task = asyncio.create_task(follow_run(served, follower, poll_s)) if follower is not None else None
        yield
        if task is not None:
            task.cancel()

    served = Served(scorer)
    routes = [Route("/score", score, methods=["POST"]), Route("/health", health, methods=["GET"]),
              Route("/version", version, methods=["GET"])]  # fmt: skip
    return Starlette(routes=routes, lifespan=lifespan)


def serve(path: str | os.PathLike, host: str = "127.0.0.1", port: int = 8000, follow: str | os.PathLike | None = None,
          poll_s: float = 1.0, threads: int = 1) -> None:  # fmt: skip
    """Load the export at ``path``, bind ``host:port`` (port 0: any free one) and serve until SIGINT or SIGTERM;
    with ``follow`` (a run directory), take up what that run publishes, looking every ``poll_s`` seconds.
    ``threads``: torch's intra-op threads for the dense program."""
    _require_extra()
    import uvicorn

    from tierec.threads import use_threads

    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {port}")
    if not poll_s > 0:
        raise ConfigError(f"--poll must be a positive number of seconds, got {poll_s}")
    if threads < 1:
        raise ConfigError(f"--threads must be at least 1, got {threads}")
    use_threads(threads)
    with contextlib.ExitStack() as stack:
        scorer = Scorer.load(path)
        follower = None
        if follow is not None:
            follower = stack.enter_context(RunFollower(follow, echo=lambda line: print(line, flush=True)))
            scorer = follower.start(scorer)
            # A delta is taken up on a worker thread; a request waiting for the interpreter lock would wait
            # up to the switch interval (5 ms) at each of its steps: 1 ms keeps requests ahead of it.
            sys.setswitchinterval(SWITCH_S)
        app = build_app(scorer, follower, poll_s)
        sock = bind(host, port)  # here, so that a port in use is one line (uvicorn would log and exit with status 3)
        bound = sock.getsockname()[1]
        following = f"; following {follow}, every {poll_s:g} s" if follow is not None else ""
        print(f"serving {path} on http://{host}:{bound} (POST /score, GET /health, GET /version){following}", flush=True)
        server = uvicorn.Server(uvicorn.Config(app, http="httptools", log_level="warning", access_log=False))
        stack.enter_context(signals_unwind())
        server.run(sockets=[sock])


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Interrupted` in the main thread while inside, so what the server holds
    is released on the way out. uvicorn shuts down gracefully on them and then raises the signal again with the
    handler it found; left at the default, that ended the process there, and a follower's workspace (copies of
    full checkpoints) stayed in the temp directory. A signal the process was started ignoring stays ignored."""

    def stop(signum: int, _frame: object) -> None:
        raise Interrupted(signum, f"serve stopped by {signal.Signals(signum).name}")

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; an address in use or not of this machine is a one-line ConfigError."""
    sock = None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and without it
        # a response written in two parts waits for the client's delayed ACK (40 ms a request, measured)
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        if sock is not None:
            sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock
