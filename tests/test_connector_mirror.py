"""The mirror invariant over random runs (see tests/connector_world.py), on both backends.

After every report, a mirror built only from the reports equals each reported request's
real beam-0 tokens and block tables, and the manager tracks exactly the live requests.
"""

import pytest

from connector_world import run_case
from tokcy import _backend

RUNS_PER_CHUNK = 1000
CHUNKS = 3  # 3,000 random runs per backend


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_mirror_invariant_random_runs(backend, chunk):
    for seed in range(chunk * RUNS_PER_CHUNK, (chunk + 1) * RUNS_PER_CHUNK):
        try:
            run_case(seed, backend)
        except AssertionError as error:
            raise AssertionError(f"random run with seed {seed} failed: {error}") from error


def test_backends_report_identically(both_backends, monkeypatch):
    """The same random program gives the same reports, row for row, on both backends."""
    compiled, pure = both_backends
    for seed in range(300):
        transcripts = []
        for module in (compiled, pure):
            monkeypatch.setattr(_backend, "module", module)
            transcripts.append(run_case(seed, module))
        assert transcripts[0] == transcripts[1], f"seed {seed}"
