"""Names of the options that the entry points and the command line share (no heavy imports, so that
the command line can list them without importing torch or JAX)."""

IMPLEMENTATIONS = ("auto", "jacobian", "ntvp", "structured")  # of the empirical NTK
STRATEGIES = IMPLEMENTATIONS[1:]
