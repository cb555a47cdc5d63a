"""relokv from Python: relocatable KV-cache management for LLM inference.

The C++ library (layouts, the relocatable cache and its policies, the stores), the example CPU
engine and the QA job, through one extension module. See docs/python.md.

    import relokv
    eng = relokv.Engine("smollm2")
    layout = eng.layout(["Paris is the capital of France."], "What is the capital of France?")
    logits = eng.prefill(layout, "epic")
    print(eng.detokenize(eng.generate(logits, 16)))
    eng.end()
"""

from ._relokv import (
    Cache,
    Engine,
    Error,
    Layout,
    LayoutBuilder,
    LayoutError,
    ModelError,
    OutOfBlocks,
    Plan,
    SpanIndex,
    Strategy,
    __version__,
    find_spans,
    strategies,
)
from . import rag

__all__ = [
    "Cache",
    "Engine",
    "Error",
    "Layout",
    "LayoutBuilder",
    "LayoutError",
    "ModelError",
    "OutOfBlocks",
    "Plan",
    "SpanIndex",
    "Strategy",
    "__version__",
    "find_spans",
    "rag",
    "strategies",
]
