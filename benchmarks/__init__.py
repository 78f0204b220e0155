"""`sgl-omni bench`: the benchmark harness (load generator, direct-compute limits, reports).

It lives in a top-level `benchmarks/` package rather than under `session_server/` because it
is a *client* of the server (it speaks the public WebSocket and HTTP APIs, like any user would)
and, in its `components` scenario, also calls the model code in `nodes/` directly to show what
the same work costs without the server. `session_server` may never import `nodes`; a package
beside the three layers may use both, and imports `nodes` only inside that one scenario.

    stats.py       percentiles, the simulated real-time player (underruns), summaries
    fixtures.py    deterministic speech input (espeak-ng, else a synthetic voiced signal)
    server.py      starts/stops the server subprocess, samples its CPU and memory
    realtime.py    N concurrent sessions over the realtime WebSocket API
    speech.py      /v1/audio/speech (whole file, SSE) and the batch endpoint under concurrency
    components.py  the same model work called directly (the limit beside each figure)
    report.py      the stdout tables, the JSON file, the PNG plot, `--compare`
    cli.py         `sgl-omni bench ...`
"""
