# The smoke run of bench/results/vllm-2026-12-06/qwen-smoke.txt:
#   PYTHONPATH=build/python $(scripts/get-vllm) smoke.py HF_DIR   (a converted model)
# Each line: (prompt tokens, tokens relokv served, kv_transfer_params, top-5 first-token logprobs).
import os, shutil, sys, time
import relokv.vllm as rv


def main():
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from transformers import AutoTokenizer
    model = sys.argv[1]
    store = "/tmp/vt/store"
    shutil.rmtree(store, ignore_errors=True); os.makedirs(store)
    tok = AutoTokenizer.from_pretrained(model)
    enc = lambda s: tok.encode(s, add_special_tokens=False)
    docs = ["The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was designed by the engineer Gustave Eiffel and completed in 1889 for the World's Fair.",
            "The Nile is a major river in northeastern Africa. It flows north for about 6,650 kilometres and empties into the Mediterranean Sea near Alexandria.",
            "Mount Fuji is the highest mountain in Japan at 3,776 metres. It is an active volcano that last erupted in 1707 and is a symbol of the country.",
            "The Great Wall of China is a series of fortifications built across northern China over many centuries to protect against raids from the steppe."]
    prefix = enc("<|im_start|>system\nAnswer from the documents.<|im_end|>\n<|im_start|>user\n")
    spans = [enc("Document: " + d + "\n") for d in docs]
    q = enc("Question: How long is the Nile?<|im_end|>\n<|im_start|>assistant\n")
    sp = lambda extra: SamplingParams(max_tokens=1, temperature=0, logprobs=5, extra_args=extra)
    kw = dict(model=model, dtype="float32", max_model_len=2048, enforce_eager=True,
              skip_tokenizer_init=True, block_size=32, enable_prefix_caching=False)
    t0 = time.time()
    llm = LLM(**kw, kv_transfer_config=rv.transfer_config("file:" + store))
    print("loaded", time.time() - t0, flush=True)
    def run(order, qq=q):
        ids, extra = rv.layout_prompt(prefix, [spans[i] for i in order], qq)
        o = llm.generate(TokensPrompt(prompt_token_ids=ids), sp(extra), use_tqdm=False)[0]
        lp = o.outputs[0].logprobs[0]
        top = sorted(((v.logprob, k) for k, v in lp.items()), reverse=True)
        return len(ids), o.num_cached_tokens, o.kv_transfer_params, [(k, round(l, 4)) for l, k in top]
    print("A", run([0, 1, 2, 3]), flush=True)
    print("A again (exact)", run([0, 1, 2, 3]), flush=True)
    print("B reordered", run([3, 1, 0, 2]), flush=True)
    print("C new doc", run([3, 1]), flush=True)
    bad = {"kv_transfer_params": {"relokv": {"segments": [["prefix", 3]]}}}
    o = llm.generate(TokensPrompt(prompt_token_ids=prefix + q), sp(bad), use_tqdm=False)[0]
    print("bad params", o.kv_transfer_params, flush=True)


if __name__ == "__main__":
    main()
