"""relokv from Python in ten lines: two rows of the demo's table (scripts/demo), then one answer."""
import relokv

result = relokv.rag.run(model="smollm2", variants=["epic"], requests=4)  # full recompute, then EPIC
for v in result.variants:
    print(f"{v.name:34} work {v.work_pct:5.1f}%  first-token KL {v.first_token_kl.mean:.3f}  "
          f"agreement {v.agreement_pct.mean:5.1f}%  TTFT p50 {v.ttft_p50_ms:.0f} ms")
engine = relokv.Engine("smollm2")
layout = engine.layout(["The Eiffel Tower was designed by Gustave Eiffel's company."], "Who designed the Eiffel Tower?")
print(engine.detokenize(engine.generate(engine.prefill(layout, "epic"), max_tokens=16)))
