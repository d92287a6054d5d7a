"""A tokenizer and a tiny random GPT-2 built here (nothing downloaded), for the prompt tests: the
ones examples/your_prompts.py stands in with when given no checkpoint."""

from __future__ import annotations

import importlib.util
from pathlib import Path

RECIPE_PATH = Path(__file__).resolve().parents[1] / "examples" / "your_prompts.py"


def recipe():
    spec = importlib.util.spec_from_file_location("your_prompts_recipe", RECIPE_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECIPE = recipe()
train_tokenizer, gpt2_source = RECIPE.train_tokenizer, RECIPE.toy_gpt2


def hf_tokenizer(tokenizer=None):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tokenizer or train_tokenizer(), eos_token=RECIPE.EOS)


def checkpoint_dir(path: Path) -> Path:
    """A transformers checkpoint directory: the tiny GPT-2 and its tokenizer, as save_pretrained writes them."""
    tokenizer = hf_tokenizer()
    gpt2_source(len(tokenizer)).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
