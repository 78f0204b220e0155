"""The runtime the server and the nodes share: typed messages, bounded edges, the graph spec and
its sessions, the executors' scheduling and the engine processes; the standard library, msgspec
and numpy only (docs/ARCHITECTURE.md, docs/batching.md)."""
