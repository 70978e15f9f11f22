"""Python that runs inside opforge's embedded interpreters (the `opforge worker` processes).

The C++ supervisor sends JSON-line requests; `opforge.worker.handle` answers them. Nothing here
runs in the supervising process.
"""
