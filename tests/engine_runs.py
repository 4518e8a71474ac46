"""What the end-to-end engine tests share: a workload run through the demo engine, and the
outputs a reference generator gives for it (one request at a time)."""

from tokcy.demo.engine import Engine, EngineConfig


def run_engine(model, workload, settings, max_iterations):
    """(the engine, its outputs) after running every request of ``workload`` to completion."""
    engine = Engine(model, EngineConfig(**settings))
    for request_id, (prompt, budget) in enumerate(zip(workload.prompts, workload.max_new_tokens)):
        engine.add_request(request_id, prompt, budget)
    return engine, engine.run(max_iterations=max_iterations)


def reference_outputs(generate, model, workload):
    """``{request id: generate(model, prompt, budget)}`` over ``workload``."""
    return {request_id: generate(model, prompt, budget)
            for request_id, (prompt, budget) in enumerate(zip(workload.prompts, workload.max_new_tokens))}
