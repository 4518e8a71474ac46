"""``python -m tokcy demo``: run the engine on a workload, check it against the reference, report."""

import argparse
import functools
import gc
import sys
import time

import tokcy
from tokcy import _backend

NO_TORCH = "tokcy demo needs torch, which is not installed: pip install torch==2.13.0"


class DefaultOnceFormatter(argparse.HelpFormatter):
    """Each option's default said once, as it is typed: appended as "(default: X)" unless the
    help text already says it or there is none (None); a sequence as its values ("16 512"),
    an on/off flag as "on" or "off"."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if default is None or default is argparse.SUPPRESS or not action.option_strings or "default" in text:
            return text
        if isinstance(action, argparse.BooleanOptionalAction):
            shown = "on" if default else "off"
        elif isinstance(default, (tuple, list)):
            shown = " ".join(map(str, default))
        else:
            shown = str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


def _parser(prog="python -m tokcy demo"):
    parser = argparse.ArgumentParser(
        prog=prog,
        description="A small continuous-batching engine on tokcy (executor + connector), checked token for "
        "token against a full-recompute greedy reference. Needs torch (pip install torch==2.13.0).",
        formatter_class=DefaultOnceFormatter,
    )
    parser.add_argument("--requests", type=int, default=32, help="number of requests")
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(16, 512), metavar=("MIN", "MAX"),
                        help="prompt lengths, drawn uniformly in [MIN, MAX]")
    parser.add_argument("--new-tokens", type=int, nargs=2, default=(32, 64), metavar=("MIN", "MAX"),
                        help="tokens to generate per request (max_new_tokens), drawn uniformly in [MIN, MAX]")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the workload")
    parser.add_argument("--num-blocks", type=int, default=160, help="KV blocks in the pool (small: preemption)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument("--max-num-tokens", type=int, default=512, help="token budget per iteration")
    parser.add_argument("--max-batch-size", type=int, default=16, help="sequences per iteration")
    parser.add_argument("--max-chunk", type=int, default=200, help="prefill chunk cap (need not divide prompts)")
    parser.add_argument("--speculation", action=argparse.BooleanOptionalAction, default=True,
                        help="prompt-lookup speculative decoding")
    parser.add_argument("--max-draft-len", type=int, default=4, help="draft tokens proposed per step at most")
    parser.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                        help="keep sampled tokens on the device; next step uses the device-token path")
    parser.add_argument("--padding", action=argparse.BooleanOptionalAction, default=False,
                        help="CUDA-graph-style padding of decode batches to --graph-sizes")
    parser.add_argument("--graph-sizes", type=int, nargs="+", default=(1, 2, 4, 8, 16),
                        help="padded batch sizes of decode-only iterations (with --padding)")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, or cuda when available")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=None,
                        help="compare every request with the reference (default: on for the built-in model, off "
                        "for --model, whose reference is transformers); --no-check also skips the mirror check")
    group = parser.add_argument_group("a real checkpoint (Llama, Mistral, Qwen2)")
    group.add_argument("--model", metavar="DIR", help="local checkpoint directory (config.json, *.safetensors)")
    group.add_argument("--dtype", default=None, help="weights and KV dtype for --model: float32 (default), "
                       "float64, float16, bfloat16")
    group.add_argument("--prompt", action="append", metavar="TEXT",
                       help="a text prompt (repeatable); needs tokenizer.json in DIR and the tokenizers package")
    return parser


def _first_difference(got, expected):
    return next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))


def main(argv=None, prog="python -m tokcy demo"):
    args = _parser(prog).parse_args(argv)
    try:
        import torch
    except ImportError:
        print(NO_TORCH, file=sys.stderr)
        return 2
    from tokcy.demo.engine import Engine, EngineConfig, same_named
    from tokcy.demo.model import ModelConfig, TinyTransformer
    from tokcy.demo.models import demo_cli
    from tokcy.demo.reference import generate
    from tokcy.demo.workload import make_workload

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("--device cuda: CUDA is not available here", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    check = args.check if args.check is not None else args.model is None
    if args.model is None:
        if args.dtype is not None or args.prompt:
            print("--dtype and --prompt need --model DIR", file=sys.stderr)
            return 2
        model = TinyTransformer(ModelConfig(), device=args.device)
        c = model.config
        description = f"built-in, vocab {c.vocab_size}, d_model {c.d_model}, {c.num_layers} layers, float64"
        workload = make_workload(args.requests, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                                 vocab_size=model.config.vocab_size, seed=args.seed)
        reference, reference_name = functools.partial(generate, model), "full recompute, no cache"
    else:
        model, description = demo_cli.load(args)
        workload = demo_cli.workload(args, model)
        reference, reference_name = demo_cli.reference(args) if check else (None, None)
    config = EngineConfig(
        **same_named(args, ("num_blocks", "block_size", "max_num_tokens", "max_batch_size", "max_chunk",
                            "speculation", "max_draft_len", "overlap", "device")),
        cuda_graph_batch_sizes=tuple(args.graph_sizes) if args.padding else None,
        check_connector=args.check is not False,
        time_after_pattern=True,
    )
    engine = Engine(model, config)
    for request_id, (prompt, budget) in enumerate(zip(workload.prompts, workload.max_new_tokens)):
        engine.add_request(request_id, prompt, budget)
    # As serving engines do after start-up: move the model's and torch's objects out of
    # the collector's reach, so a full collection (about 0.1 s with torch loaded) does not
    # land inside one timed iteration and dominate the per-iteration means printed below.
    gc.collect()
    gc.freeze()
    start = time.perf_counter()
    outputs = engine.run()
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    engine_time = time.perf_counter() - start

    mismatched = []
    reference_time = 0.0
    if check:
        start = time.perf_counter()
        for request_id, (prompt, budget) in enumerate(zip(workload.prompts, workload.max_new_tokens)):
            expected = reference(prompt, budget)
            if outputs.get(request_id) != expected:
                mismatched.append((request_id, _first_difference(outputs.get(request_id) or [], expected)))
        reference_time = time.perf_counter() - start

    stats = engine.stats
    iterations = max(stats.iterations, 1)
    per_iteration_us = lambda seconds: 1e6 * seconds / iterations  # noqa: E731
    timed = max(stats.timed_batches, 1)
    modes = [name for name, on in (("speculation", args.speculation), ("overlap", args.overlap),
                                   ("padding", args.padding)) if on]
    print(f"tokcy {tokcy.__version__} demo: backend {_backend.BACKEND}, device {args.device}, "
          f"torch {torch.__version__} ({torch.get_num_threads()} thread(s)), modes: {', '.join(modes) or 'plain'}")
    if _backend.WHY_PURE:  # as the bench header says it
        print(f"   (the compiled core is not in use: {_backend.WHY_PURE})")
    print(f"model: {description}; KV pool {args.num_blocks} blocks x {args.block_size} tokens")
    print(f"requests: {len(workload)} (prompts {min(map(len, workload.prompts))}-{max(map(len, workload.prompts))} "
          f"tokens, {workload.num_prompt_tokens} in all; {sum(workload.max_new_tokens)} tokens to generate)")
    print(f"tokens: {stats.generated_tokens} generated, {stats.forward_tokens} token rows through the model "
          f"({stats.padding_rows} padding rows, {stats.device_token_rows} device-token rows, "
          f"{stats.context_chunks} prefill chunks)")
    print(f"iterations: {stats.iterations} ({stats.decode_only_iterations} decode-only), "
          f"preemptions: {stats.preemptions}")
    if args.speculation:
        rate = stats.drafts_accepted / stats.drafts_proposed if stats.drafts_proposed else 0.0
        print(f"drafts: {stats.drafts_proposed} proposed in {stats.draft_steps} verifications, "
              f"{stats.drafts_accepted} accepted (acceptance rate {rate:.1%})")
    print(f"host time per iteration: input preparation {per_iteration_us(stats.time_prepare):.1f} us, "
          f"connector report {per_iteration_us(stats.time_report):.1f} us, "
          f"model forward {per_iteration_us(stats.time_forward):.1f} us")
    print(f"input preparation on the same {stats.timed_batches} batches: tokcy prepare_inputs "
          f"{1e6 * stats.time_prepare_host / timed:.1f} us vs the 'after' pattern (per-request Python loop) "
          f"{1e6 * stats.time_after_pattern / timed:.1f} us per iteration")
    if stats.released_blocks:
        print(f"sliding window: {stats.released_blocks} blocks released and freed")
    if args.prompt:
        demo_cli.print_texts(args, outputs)
    print(f"engine wall time {engine_time:.2f} s", end="")
    if check:
        print(f"; reference ({reference_name}) {reference_time:.2f} s; connector mirror checked on "
              f"{engine.store.reports} reports")
        if mismatched:
            where = ", ".join(f"{request_id} (from generated token {first})" for request_id, first in mismatched)
            print(f"MISMATCH: {len(mismatched)} of {len(workload)} requests differ from the reference: {where}")
            return 1
        print(f"OK: all {len(workload)} requests equal the reference token for token")
    else:
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
