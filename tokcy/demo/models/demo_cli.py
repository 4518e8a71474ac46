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
    if args.prompt:
        encode = tokenizer(args.model).encode
        prompts = tuple(tuple(encode(text).ids) for text in args.prompt)
        if not all(prompts):
            raise SystemExit("--prompt: a prompt encodes to no tokens")
        return Workload(prompts, (args.new_tokens[1],) * len(prompts))
    return make_workload(args.requests, prompt_len=prompt_lengths(args), new_tokens=args.new_tokens,
                         vocab_size=model.config.vocab_size, seed=args.seed)


def prompt_lengths(args):
    """``--prompt-len`` (MIN, MAX), MAX lowered (with a note) so that no sequence outgrows the
    checkpoint's ``max_position_embeddings`` with its largest ``--new-tokens`` budget."""
    low, high = args.prompt_len
    try:
        with open(os.path.join(args.model, "config.json")) as file:
            positions = json.load(file).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return low, high  # load() read the config already: what it could not read, it refused
    if not isinstance(positions, int) or high + args.new_tokens[1] <= positions:
        return low, high
    lowered = max(low, positions - args.new_tokens[1])
    print(f"--prompt-len: MAX lowered from {high} to {lowered}: the checkpoint has {positions} positions "
          f"(max_position_embeddings) and a request may generate {args.new_tokens[1]} tokens", file=sys.stderr)
    return low, lowered


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
