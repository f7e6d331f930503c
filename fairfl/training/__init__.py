"""How local training runs: the simulated clients an algorithm is handed (``client``), the run-batched
engine that trains many (run, client) pairs as one computation (``engine``), and where a sweep's
groups train (``backends``: serial, a process pool, Ray)."""
