"""Validation loss of a shipped adapter on distill.py's first N validation prompts (the same
prompts, the same student), to set it beside the new adapters' curves."""
import json, os, sys
sys.path.insert(0, "/work/main/tools/links")
import numpy as np
import distill
from links import adapter, pic, student
from links import model as M
L = os.path.expanduser("~/.cache/relokv/links/smollm2")
mpath = os.path.expanduser("~/.cache/relokv/SmolLM2-135M-Instruct.Q4_1.gguf")
model = M.load(mpath)
w = json.load(open(L + "/workload.json")); ps = json.load(open(L + "/prompts.json"))
teacher = distill.load_teacher(L + "/teacher.jsonl")
data, meta = adapter.read(sys.argv[1])
shape, theta = student.from_file(data, meta, model)
idx = [i for i, p in enumerate(ps["prompts"]) if i in teacher]
lo = int(sys.argv[3]) if len(sys.argv) > 3 else 0
val = [i for i in idx if ps["prompts"][i]["split"] == "validation"
       and len(ps["prompts"][i]["passages"]) >= lo][: int(sys.argv[2])]
ex = distill.Examples(model, pic.Runner(model), w, shape)
items = [ex.build(ps["prompts"][i], teacher[i]) for i in val]
print(sys.argv[1], shape, json.dumps(distill.score(ex, shape, model.params, model.cfg, theta, items)))
