"""``tokcy.demo.load_model``: what it accepts, what it refuses, and that its forward is transformers' math.

The forward is fed hand-built step inputs (``model_checkpoints.step_inputs``, position by
position from Python lists) over a NaN-filled paged cache, and its logits are compared
with ``transformers``' own forward of the whole sequence, in float64.
"""

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers", reason="the model tests compare with transformers")
pytest.importorskip("safetensors", reason="checkpoint directories are read with safetensors")

from model_checkpoints import ARCHITECTURES, ListKVCache, random_model, step_inputs  # noqa: E402

from tokcy.demo.models import CheckpointError, UnsupportedModelError, load_model, parse_dtype  # noqa: E402
from tokcy.demo.models.config import parse_config  # noqa: E402
from tokcy.demo.models.llama import rope_inverse_frequencies  # noqa: E402

torch.set_num_threads(1)
BLOCK = 4


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (transformers model, its save_pretrained directory)."""
    out = {}
    for seed, name in enumerate(ARCHITECTURES):
        model = random_model(name, seed=seed)
        directory = tmp_path_factory.mktemp(name)
        model.save_pretrained(directory)
        out[name] = model, directory
    return out


def transformers_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


@pytest.mark.parametrize("loaded_from", ["object", "directory"])
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_paged_chunked_forward_equals_transformers_logits(backend, checkpoints, name, loaded_from):
    reference, directory = checkpoints[name]
    model = load_model(reference if loaded_from == "object" else directory, dtype=torch.float64)
    config = model.config
    tokens = torch.randint(0, config.vocab_size, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    other = [3, 1, 4, 1, 5, 9, 2]
    expected, expected_other = transformers_logits(reference, tokens), transformers_logits(reference, other + [6])
    cache = ListKVCache(64 * BLOCK, BLOCK, config.num_layers, config.num_kv_heads, config.head_dim)
    blocks, other_blocks = [17, 3, 40, 8, 9, 22, 31, 12, 5, 60], [50, 51]
    # step 1: a chunk of 13 beside a whole prompt of 7; step 2: the other 24 beside one decode row
    first = model.forward(step_inputs([(tokens[:13], 0, blocks), (other, 0, other_blocks)], BLOCK), cache)
    second = model.forward(step_inputs([(tokens[13:], 13, blocks), ([6], 7, other_blocks)], BLOCK), cache)
    torch.testing.assert_close(first, torch.stack([expected[12], expected_other[6]]), rtol=0, atol=1e-12)
    torch.testing.assert_close(second, torch.stack([expected[36], expected_other[7]]), rtol=0, atol=1e-12)
    if config.sliding_window is not None:  # Mistral: blocks wholly behind the window are not read
        assert config.sliding_window < 24
        released = [-1 if (b + 1) * BLOCK <= 37 - config.sliding_window else block for b, block in enumerate(blocks)]
        assert released.count(-1) >= 3
        again = model.forward(step_inputs([(tokens[36:], 36, released)], BLOCK), cache)
        torch.testing.assert_close(again[0], expected[36], rtol=0, atol=1e-12)


def test_float32_forward_is_close_to_transformers_float32(backend, checkpoints):
    from tokcy.demo.models.reference import reference_model

    directory = checkpoints["llama3"][1]
    model = load_model(directory)  # float32 by default
    assert model.dtype == torch.float32
    tokens = list(range(5, 30))
    expected = transformers_logits(reference_model(directory, dtype=torch.float32), tokens)
    config = model.config
    cache = ListKVCache(16 * BLOCK, BLOCK, config.num_layers, config.num_kv_heads, config.head_dim, torch.float32)
    logits = model.forward(step_inputs([(tokens, 0, list(range(8)))], BLOCK), cache)
    torch.testing.assert_close(logits[0], expected[-1], rtol=1e-4, atol=1e-4)


def test_rope_inverse_frequencies_are_transformers_own(backend, checkpoints):
    for name, (reference, _) in checkpoints.items():
        model = load_model(reference, dtype=torch.float64)
        assert torch.equal(rope_inverse_frequencies(model.config),
                           reference.model.rotary_emb.inv_freq.to(torch.float32)), name
    # Llama-3 scaling changed the lower frequencies and kept the highest one
    plain = rope_inverse_frequencies(parse_config({**checkpoints["llama3"][0].config.to_dict(), "rope_parameters": {}}))
    scaled = rope_inverse_frequencies(load_model(checkpoints["llama3"][0], dtype=torch.float64).config)
    assert scaled[0] == plain[0] and (scaled[1:] < plain[1:]).all()


def test_config_fields_read_from_each_architecture(backend, checkpoints):
    llama = load_model(checkpoints["llama3"][1]).config
    mistral = load_model(checkpoints["mistral"][1]).config
    qwen2 = load_model(checkpoints["qwen2"][1]).config
    assert (llama.num_heads, llama.num_kv_heads, llama.head_dim, llama.num_layers) == (4, 2, 8, 2)
    assert llama.rope_scaling.original_max_position_embeddings == 64 and not llama.tie_word_embeddings
    assert (llama.qkv_bias, llama.o_proj_bias, llama.sliding_window) == (False, False, None)
    assert mistral.sliding_windows == (11, 11) and mistral.sliding_window == 11
    assert (qwen2.qkv_bias, qwen2.o_proj_bias, qwen2.tie_word_embeddings) == (True, False, True)
    assert qwen2.sliding_window is None


def test_sharded_checkpoint_loads_the_same_weights(backend, checkpoints, tmp_path):
    reference, directory = checkpoints["mistral"]
    reference.save_pretrained(tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3
    sharded, single = load_model(tmp_path, dtype=torch.float64), load_model(directory, dtype=torch.float64)
    for mine, theirs in zip(sharded.layers, single.layers):
        assert torch.equal(mine.qkv_weight, theirs.qkv_weight) and torch.equal(mine.down_weight, theirs.down_weight)
    assert torch.equal(sharded.lm_head, single.lm_head)


def test_a_directory_loads_without_importing_transformers(backend, checkpoints):
    directory = checkpoints["qwen2"][1]
    code = ("import sys; from tokcy.demo.models import load_model; "
            f"m = load_model({str(directory)!r}); assert 'transformers' not in sys.modules, 'imported'; print(m)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "qwen2: 2 layers" in done.stdout


def base(name, checkpoints):
    return checkpoints[name][0].config.to_dict()


@pytest.mark.parametrize(
    "name, change, named",
    [
        ("llama3", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ("llama3", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "'yarn'"),
        ("llama3", {"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "'linear'"),
        ("llama3", {"rope_parameters": None, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "'dynamic'"),
        ("llama3", {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
         "partial_rotary_factor"),
        ("llama3", {"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
        ("llama3", {"attn_logit_softcapping": 50.0}, "'attn_logit_softcapping'"),
        ("mistral", {"layer_types": ["sliding_attention", "full_attention"]}, "'layer_types'"),
        ("mistral", {"attention_bias": True}, "'attention_bias'"),
        ("qwen2", {"mlp_bias": True}, "'mlp_bias'"),
        ("qwen2", {"layer_types": ["full_attention", "chunked_attention"]}, "'chunked_attention'"),
        ("llama3", {"num_key_value_heads": 3}, "num_key_value_heads=3"),
        ("llama3", {"model_type": "gemma"}, "model_type 'gemma'"),
    ],
)
def test_unsupported_config_option_is_refused_with_its_name(backend, checkpoints, tmp_path, name, change, named):
    mapping = {**base(name, checkpoints), **change}
    with pytest.raises(UnsupportedModelError, match=named.replace("[", r"\[")) as refused:
        parse_config(mapping)
    # the same from a checkpoint directory
    _, directory = checkpoints[name]
    for path in directory.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(mapping))
    with pytest.raises(UnsupportedModelError) as again:
        load_model(tmp_path)
    assert str(again.value) == str(refused.value)


def test_supported_variants_parse(backend, checkpoints):
    llama = base("llama3", checkpoints)
    legacy = {**llama, "rope_parameters": None, "rope_theta": 500000.0,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}}
    config = parse_config(legacy)
    assert config.rope_theta == 500000.0 and config.rope_scaling.factor == 8.0
    biased = parse_config({**llama, "attention_bias": True, "mlp_bias": True})
    assert biased.qkv_bias and biased.o_proj_bias and biased.mlp_bias
    qwen = parse_config({**base("qwen2", checkpoints), "use_sliding_window": True, "sliding_window": 9,
                         "layer_types": None, "max_window_layers": 1})
    assert qwen.sliding_windows == (None, 9) and qwen.sliding_window is None  # one full layer: nothing released
    assert parse_config({**base("mistral", checkpoints), "sliding_window": None}).sliding_window is None


@pytest.mark.parametrize(
    "name, options",
    [("llama3", dict(attention_bias=True, mlp_bias=True)),
     # one full-attention layer, then a sliding one: per-layer masks, and nothing may be released
     ("qwen2", dict(use_sliding_window=True, sliding_window=5, max_window_layers=1))],
    ids=["biased-llama", "qwen2-sliding-layers"],
)
def test_variants_equal_transformers(backend, name, options):
    reference = random_model(name, seed=4, **options)
    model = load_model(reference, dtype=torch.float64)
    config = model.config
    assert name != "qwen2" or (config.sliding_windows == (None, 5) and config.sliding_window is None)
    tokens = list(range(3, 22))
    expected = transformers_logits(reference, tokens)
    cache = ListKVCache(8 * BLOCK, BLOCK, config.num_layers, config.num_kv_heads, config.head_dim)
    first = model.forward(step_inputs([(tokens[:9], 0, list(range(5)))], BLOCK), cache)
    second = model.forward(step_inputs([(tokens[9:], 9, list(range(5)))], BLOCK), cache)
    torch.testing.assert_close(first[0], expected[8], rtol=0, atol=1e-12)
    torch.testing.assert_close(second[0], expected[-1], rtol=0, atol=1e-12)


def test_checkpoint_problems_are_named(backend, checkpoints, tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        load_model(tmp_path)
    with pytest.raises(CheckpointError, match="not a directory"):
        load_model(tmp_path / "missing")
    reference, directory = checkpoints["llama3"]
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    with pytest.raises(CheckpointError, match="neither model.safetensors nor model.safetensors.index.json"):
        load_model(tmp_path)
    from safetensors.torch import save_file

    state = {name: tensor.contiguous() for name, tensor in reference.state_dict().items()}
    save_file({k: v for k, v in state.items() if k != "model.norm.weight"}, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="tensor model.norm.weight is missing"):
        load_model(tmp_path)
    save_file({**state, "model.layers.0.self_attn.q_norm.weight": torch.ones(8)}, tmp_path / "model.safetensors")
    with pytest.raises(UnsupportedModelError, match="tensor model.layers.0.self_attn.q_norm.weight is not part"):
        load_model(tmp_path)
    save_file({**state, "model.norm.weight": torch.ones(31)}, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model.norm.weight has shape \(31,\), the config says \(32,\)"):
        load_model(tmp_path)
    with pytest.raises(UnsupportedModelError, match="base model without an LM head"):
        load_model(reference.model)
    with pytest.raises(TypeError, match="checkpoint directory or a transformers causal-LM"):
        load_model(42)


def test_dtype_names(backend):
    assert parse_dtype("bfloat16") is torch.bfloat16 and parse_dtype("torch.float16") is torch.float16
    assert parse_dtype(torch.float64) is torch.float64
    with pytest.raises(ValueError, match="dtype 'int8' is not one of"):
        parse_dtype("int8")
    with pytest.raises(TypeError, match="floating torch.dtype"):
        parse_dtype(torch.int32)


def test_a_kv_cache_of_another_dtype_is_refused(backend, checkpoints):
    model = load_model(checkpoints["llama3"][1], dtype=torch.float64)
    config = model.config
    cache = ListKVCache(8 * BLOCK, BLOCK, config.num_layers, config.num_kv_heads, config.head_dim, torch.float32)
    with pytest.raises(ValueError, match="the KV cache holds torch.float32, the model computes in torch.float64"):
        model.forward(step_inputs([([1, 2, 3], 0, [0])], BLOCK), cache)


def test_sliding_window_attention_gathers_the_window_only(backend, checkpoints):
    """Counting, not timing: a Mistral step gathers window + max_query_len - 1 key positions per
    sequence at any context length; a full-attention model gathers max_kv_len."""
    from tokcy.demo.models.attention import AttentionPlan

    window = load_model(checkpoints["mistral"][1]).config.sliding_window
    for context in (40, 4000):
        blocks = list(range(context // BLOCK + 1))
        decode = step_inputs([([5], context, blocks), ([6], 20, blocks[:6])], BLOCK)
        chunk = step_inputs([([5] * 7, context, blocks + [len(blocks)])], BLOCK)
        assert AttentionPlan(decode, BLOCK, (window, window)).key_slots.shape == (2, window)
        assert AttentionPlan(chunk, BLOCK, (window, window)).key_slots.shape == (1, window + 6)
        assert AttentionPlan(decode, BLOCK, (None, None)).key_slots.shape == (2, context + 1)
