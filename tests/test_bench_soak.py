"""The soak scenario's engine loop, briefly: its connector mirror stays exact on both
backends, both backends run the same program, and the CLI prints the trend."""

import pytest

from tokcy.bench import cli, soak


def test_a_short_soak_keeps_the_mirror_exact(backend):
    seconds, samples, engine = soak.soak(backend, 3_000, 1_000, seed=3)
    assert [iteration for iteration, _ in samples] == [0, 1_000, 2_000, 3_000]
    assert all(mib > 0 for _, mib in samples)
    # every finished request and every scheduled one at each sample was checked
    assert engine.mirror.checks >= engine.finished > 100
    assert engine.paused > 10 and engine.rejected > 1_000 and engine.next_id > engine.finished
    assert engine.manager.num_tracked_requests == len(engine.live) <= soak.LIVE_REQUESTS


def test_the_mirror_notices_a_drifted_request(backend):
    engine = soak.Engine(backend, seed=1)
    for _ in range(50):
        engine.step()
    request = engine.live[0]
    engine.mirror.tokens[request.request_id].append(7)  # what a lost report would leave
    with pytest.raises(AssertionError, match=f"mirror of request {request.request_id} drifted"):
        engine.mirror.check(request)


def test_both_backends_run_the_same_program(both_backends):
    from tokcy.bench import backends

    runs = []
    for name in ("cython", "python"):
        with backends.use(name) as module:
            _, _, engine = soak.soak(module, 1_000, 1_000, seed=5)
        runs.append((engine.next_id, engine.finished, engine.paused, engine.drafted, engine.rejected, engine.mirror.checks))
    assert runs[0] == runs[1]


def test_cli_runs_the_soak_only_when_named(backend, capsys):
    assert "soak" not in cli.SCENARIOS
    name = "cython" if backend.__name__ == "tokcy._core" else "python"
    assert cli.main(["--smoke", "--backend", name, "--scenario", "soak"]) == 0
    out = capsys.readouterr().out
    assert "Soak: an engine loop" in out and "iterations/s; RSS MiB" in out and "always equal" in out
