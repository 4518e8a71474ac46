"""``python -m tokcy demo --model DIR``: a checkpoint directory through the engine, checked against transformers."""

import pytest
import torch

pytest.importorskip("transformers", reason="the model tests compare with transformers")
pytest.importorskip("safetensors", reason="checkpoint directories are read with safetensors")

from model_checkpoints import ARCHITECTURES, random_model  # noqa: E402

from tokcy.demo.cli import main  # noqa: E402

SMALL = ["--requests", "3", "--prompt-len", "12", "40", "--new-tokens", "4", "8", "--num-blocks", "40",
         "--block-size", "4", "--max-chunk", "9"]
WORDS = ("[UNK] the a cat dog sat on mat and ran to hat big small red blue green one two three four five six seven "
         "eight nine ten is was it he she we they").split()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for name in ARCHITECTURES:
        directory = tmp_path_factory.mktemp(name)
        random_model(name, seed=3).save_pretrained(directory)
        out[name] = directory
    return out


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_demo_on_a_checkpoint_equals_transformers(backend, checkpoints, capsys, name):
    assert main(["--model", str(checkpoints[name]), "--check", "--dtype", "float64", *SMALL]) == 0
    out = capsys.readouterr().out
    assert f"model: {ARCHITECTURES[name][0].removesuffix('Config').lower()} checkpoint" in out
    assert "reference (transformers" in out and "OK: all 3 requests equal the reference token for token" in out
    assert ("sliding window: " in out) == (name == "mistral")


def test_demo_on_a_checkpoint_without_check_runs_the_engine_only(backend, checkpoints, capsys):
    assert main(["--model", str(checkpoints["qwen2"]), "--no-speculation", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "float32" in out and "reference" not in out and "OK: all" not in out
    assert "host time per iteration: input preparation" in out


def test_prompts_fit_the_checkpoints_positions(backend, tmp_path, capsys):
    """The default workload's prompts (up to 512 tokens) on a checkpoint of 64 positions:
    --prompt-len MAX is lowered so that a prompt and its largest budget fit, and said so."""
    random_model("qwen2", seed=1, max_position_embeddings=64).save_pretrained(tmp_path)
    argv = ["--model", str(tmp_path), "--check", "--dtype", "float64", "--requests", "3", "--new-tokens", "4", "8",
            "--block-size", "4", "--num-blocks", "64"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert ("--prompt-len: MAX lowered from 512 to 56: the checkpoint has 64 positions (max_position_embeddings) "
            "and a request may generate 8 tokens") in captured.err
    assert "OK: all 3 requests equal the reference token for token" in captured.out
    with pytest.raises(SystemExit, match=r"^--prompt-len MIN 60 and --new-tokens MAX 8 pass the checkpoint's 64 "
                                         r"positions \(max_position_embeddings\)$"):
        main(argv + ["--prompt-len", "60", "70"])


def test_text_prompts_are_encoded_and_the_output_decoded(backend, checkpoints, capsys, tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    for path in checkpoints["llama3"].iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    argv = ["--model", str(tmp_path), "--check", "--prompt", "the cat sat on the mat", "--prompt", "one two three",
            "--new-tokens", "5", "6"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("[")]
    assert [line.split(" -> ")[0] for line in lines] == ["[0] 'the cat sat on the mat'", "[1] 'one two three'"]
    # the decoded text is the tokenizer's decoding of what transformers generates
    from tokcy.demo.models.reference import generate, reference_model

    hf_model = reference_model(tmp_path, dtype=torch.float32)
    first = generate(hf_model, tokenizer.encode("the cat sat on the mat").ids, 6)
    assert lines[0].split(" -> ")[1] == repr(tokenizer.decode(first))
    assert "OK: all 2 requests equal the reference" in out


def test_bad_arguments_are_named(backend, checkpoints, capsys, tmp_path):
    assert main(["--dtype", "float16"]) == 2
    assert "--dtype and --prompt need --model DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="has no tokenizer.json"):
        main(["--model", str(checkpoints["qwen2"]), "--prompt", "hello"])
    with pytest.raises(SystemExit, match="--model: dtype 'int8' is not one of"):
        main(["--model", str(checkpoints["qwen2"]), "--dtype", "int8"])
    with pytest.raises(SystemExit, match="--model: .*: no config.json"):
        main(["--model", str(tmp_path)])
