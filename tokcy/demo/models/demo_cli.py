"""The ``--model DIR`` side of ``python -m tokcy demo``: a checkpoint, its prompts, its reference.

``python -m tokcy demo --model DIR`` runs the demo workload (prompts are token ids drawn
from the checkpoint's vocabulary) through the engine on that checkpoint; ``--prompt TEXT``
(repeatable) runs those texts instead when the directory has a ``tokenizer.json`` and the
``tokenizers`` package is installed, and prints the decoded continuations; ``--check``
compares every request with ``transformers``' own greedy ``generate`` on the same weights,
at the same dtype and on the same device.
"""

import functools
import json
import os
import sys

from tokcy.demo.workload import Workload, make_workload

TOKENIZER_FILE = "tokenizer.json"


def load(args):
    """(model, one-line description) for ``args.model``; raises SystemExit with a message on failure."""
    import torch

    from tokcy.demo.models import CheckpointError, UnsupportedModelError, load_model

    try:
        model = load_model(args.model, device=args.device, dtype=args.dtype or torch.float32)
    except (CheckpointError, UnsupportedModelError, ValueError, TypeError) as error:
        raise SystemExit(f"--model: {error}") from None
    c = model.config
    window = f", sliding window {c.sliding_window}" if c.sliding_window else ""
    description = (f"{c.model_type} checkpoint {args.model}: {c.num_layers} layers, hidden {c.hidden_size}, "
                   f"{c.num_heads} heads / {c.num_kv_heads} KV heads x {c.head_dim}, vocab {c.vocab_size}"
                   f"{window}, {str(model.dtype).removeprefix('torch.')}")
    return model, description


def tokenizer(directory):
    path = os.path.join(directory, TOKENIZER_FILE)
    if not os.path.isfile(path):
        raise SystemExit(f"--prompt: {directory} has no {TOKENIZER_FILE}; give token ids instead (drop --prompt)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SystemExit("--prompt needs the tokenizers package (pip install tokenizers)") from None
    return Tokenizer.from_file(path)


def workload(args, model):
    """The requests: the text prompts when given (each with the largest --new-tokens budget), else the
    default workload over the model's vocabulary."""
    positions, budget = max_positions(args.model), args.new_tokens[1]
    if args.prompt:
        encode = tokenizer(args.model).encode
        prompts = tuple(tuple(encode(text).ids) for text in args.prompt)
        if not all(prompts):
            raise SystemExit("--prompt: a prompt encodes to no tokens")
        longest = max(len(prompt) for prompt in prompts)
        if positions is not None and longest + budget > positions:
            raise SystemExit(f"--prompt: a prompt of {longest} tokens and --new-tokens MAX {budget} pass the "
                             f"checkpoint's {positions} positions (max_position_embeddings)")
        return Workload(prompts, (budget,) * len(prompts))
    low, high = args.prompt_len
    if positions is not None and high + budget > positions:
        if low + budget > positions:
            raise SystemExit(f"--prompt-len MIN {low} and --new-tokens MAX {budget} pass the checkpoint's "
                             f"{positions} positions (max_position_embeddings)")
        print(f"--prompt-len: MAX lowered from {high} to {positions - budget}: the checkpoint has {positions} "
              f"positions (max_position_embeddings) and a request may generate {budget} tokens", file=sys.stderr)
        high = positions - budget
    return make_workload(args.requests, prompt_len=(low, high), new_tokens=args.new_tokens,
                         vocab_size=model.config.vocab_size, seed=args.seed)


def max_positions(directory):
    """The checkpoint's ``max_position_embeddings`` (None if its config does not say)."""
    try:
        with open(os.path.join(directory, "config.json")) as file:
            positions = json.load(file).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None  # load() read the config already: what it could not read, it refused
    return positions if isinstance(positions, int) and positions > 0 else None


def reference(args):
    """(greedy generate function of (prompt, budget), its name) backed by transformers on the same weights."""
    try:
        import transformers
    except ImportError:
        raise SystemExit("--check with --model needs transformers (pip install 'tokcy[models]')") from None
    import torch

    from tokcy.demo.models import parse_dtype
    from tokcy.demo.models.reference import generate, reference_model

    hf_model = reference_model(args.model, device=args.device, dtype=parse_dtype(args.dtype or torch.float32))
    name = f"transformers {transformers.__version__} generate(do_sample=False), one request at a time"
    return functools.partial(generate, hf_model), name


def print_texts(args, outputs):
    decode = tokenizer(args.model).decode
    for request_id, text in enumerate(args.prompt):
        print(f"[{request_id}] {text!r} -> {decode(list(outputs[request_id]))!r}")
