#!/usr/bin/env python3
"""A GGUF's byte-level BPE tokenizer as a Hugging Face tokenizer directory (tokenizer.json), for
the benchmark tools that count tokens with one (aiperf --tokenizer DIR); no network, no PyTorch.
SentencePiece vocabularies (Gemma) are not converted: the tools then count with SmolLM2's.
  bench/tools/gguf_tokenizer.py MODEL.gguf OUT_DIR
"""
import json
import os
import sys

import gguf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers


def strings(reader, name):
    f = reader.fields[name]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    r = gguf.GGUFReader(sys.argv[1])
    if "tokenizer.ggml.merges" not in r.fields:
        print(f"{sys.argv[1]}: not a byte-level BPE vocabulary (no merges)", file=sys.stderr)
        return 1
    toks = strings(r, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings(r, "tokenizer.ggml.merges")]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(toks)}, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    os.makedirs(sys.argv[2], exist_ok=True)
    tk.save(os.path.join(sys.argv[2], "tokenizer.json"))
    with open(os.path.join(sys.argv[2], "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 32768}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
