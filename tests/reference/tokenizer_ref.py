#!/usr/bin/env python3
"""Reference token ids for the tokenizer parity test, from Hugging Face `tokenizers`.

Builds each model's byte-level BPE from its GGUF (vocabulary, merges, special tokens) with the
pre-tokenizer its upstream tokenizer.json declares, encodes every string of
tests/engine/data/tokenizer_strings.txt (one JSON string per line) and writes one line per
string: the model name, a tab, then the ids. The output is committed
(tests/engine/data/tokenizer_ref_ids.tsv); the C++ test needs neither Python nor the package.

    pip install tokenizers numpy
    python3 tests/reference/tokenizer_ref.py smollm2=PATH.gguf qwen2.5-0.5b=PATH.gguf
"""
import json
import os
import sys

from tokenizers import Regex, Tokenizer, models, pre_tokenizers

sys.path.insert(0, os.path.dirname(__file__))
import llama_ref  # noqa: E402  (its GGUF reader)

QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def build(path):
    _, meta, _, _ = llama_ref.read_gguf(path)
    vocab = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
    pre = meta.get("tokenizer.ggml.pre", "gpt2")
    if pre == "qwen2":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    types = meta.get("tokenizer.ggml.token_type", [])
    specials = [t for t, ty in zip(meta["tokenizer.ggml.tokens"], types) if ty in (3, 4)]
    tok.add_special_tokens(specials)
    return tok


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    data = os.path.join(here, "..", "engine", "data")
    with open(os.path.join(data, "tokenizer_strings.txt"), encoding="utf-8") as f:
        strings = [json.loads(line) for line in f if line.strip()]
    out = []
    for arg in sys.argv[1:]:
        name, path = arg.split("=", 1)
        tok = build(path)
        for s in strings:
            ids = tok.encode(s, add_special_tokens=False).ids
            out.append(name + "\t" + " ".join(map(str, ids)))
    with open(os.path.join(data, "tokenizer_ref_ids.tsv"), "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
