"""Load benchmark: a real gateway process, the real stdio test upstream, N concurrent clients.

Starts ``python -m satgate_mcp serve`` on a free loopback port with ``tests/upstream_server.py`` as
its one stdio upstream, opens N MCP sessions (the raw client of ``bench.client``, or the official SDK
client), then has every client call ``echo`` COUNT times in a loop, all clients at once. Prints calls/s,
latency percentiles and the gateway's resident memory before and after (from /proc/<pid>/status),
then stops the gateway's process group. Everything is bounded by ``--timeout``; nothing listens
beyond 127.0.0.1.

    .venv/bin/python -m bench --clients 20 --calls 200 --auth header --client raw

``--compare`` runs a side-by-side benchmark instead. The baseline is the same SDK upstream served alone
over Streamable HTTP. It is compared with the gateway over that upstream via stdio, in auth ``none`` and
``header``: N sessions and M workers calling ``echo`` for ``--duration`` seconds, in ``--rounds``
interleaved rounds (a fresh server each time). Per target it reports calls/s, the ratio to the same
round's baseline, p50/p99 under load, p50 of one call at a time, server CPU ms per call from
/proc/<pid>/stat (the process and its children, separately and together, over the load window only) and
initialize/s. For the gateway alone it adds idle KiB per session, a resumed session's first call (on a
second process) against an ordinary first call, and the SSE answer path against the JSON one: for
``echo`` when the gateway answers it SSE, and always for a call with one progress notification (``slow``,
which streams when the client reads SSE). ``--soak SECONDS`` adds a gateway under load for that long with
its RSS sampled (flat or not). With ``taskset`` and two CPUs, the server under test runs on the first CPU and the
load generator on the second. Figures are printed, never asserted; ``--json`` prints them as one object.

    .venv/bin/python -m bench --compare                  # 8 sessions, 16 workers, 10 s x 3 rounds
    .venv/bin/python -m bench --compare --duration 2 --rounds 1 --json

``python scripts/bench.py`` is the same command. Modules, by concern: ``processes`` (the servers under test),
``client`` (the one raw HTTP client), ``procfs`` (/proc sampling), ``stats``, ``calibration``, ``render``,
``load`` and ``phases`` (what is measured), ``pipes`` (the calibration row), ``plain`` and ``compare`` (the two
modes), ``cli``.
"""
