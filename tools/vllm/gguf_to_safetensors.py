#!/usr/bin/env python3
"""Converts one of the project's GGUF models (scripts/get-model) to a Hugging Face directory of
safetensors that vLLM's CPU build loads (it cannot load GGUF on CPU), offline: transformers
dequantizes the GGUF (and undoes the converter's Q/K row permutation of llama models) and
writes float32 weights, the config and the tokenizer. Run with the vLLM environment's python
(scripts/get-vllm installs transformers, gguf and accelerate there).
    gguf_to_safetensors.py GGUF OUT_DIR
Idempotent: an OUT_DIR holding a complete conversion of the same file is kept."""
import json
import os
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gguf_to_safetensors.py GGUF OUT_DIR")
    gguf, out = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if not os.path.isfile(gguf):
        sys.exit(f"gguf_to_safetensors: no such file: {gguf}")
    stamp = os.path.join(out, "relokv-source.json")
    st = os.stat(gguf)
    source = {"gguf": os.path.basename(gguf), "size": st.st_size}
    if os.path.isfile(stamp):
        with open(stamp) as f:
            if json.load(f) == source:
                print(out)
                return
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, name = os.path.dirname(gguf), os.path.basename(gguf)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    # The weights are dequantized: what is saved is a plain float32 checkpoint, not a
    # GGUF-quantized one (transformers refuses to serialize that marker).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    with open(stamp, "w") as f:
        json.dump(source, f)
    print(out)


if __name__ == "__main__":
    main()
