# llama.cpp (llama-cpp-python) as every peer test and benchmark loads it; prepended to each
# script that runs it (engine/tests/common/peers.rs, scripts/bench_peers.py,
# scripts/bench_agent.py). No extra buffer types (AMX, repacked weights): on CPUs with AMX
# (Sapphire Rapids and later) llama.cpp 0.3.36's AMX buffers crashed the process (SIGSEGV in
# `decode`, seen here); the plain CPU kernels run everywhere.
import llama_cpp.llama_cpp as _C
_defaults = _C.llama_model_default_params
def _plain_params():
    p = _defaults()
    p.use_extra_bufts = False
    return p
_C.llama_model_default_params = _plain_params

def greedy(llm, ids, n, top):
    """llama.cpp's greedy continuation of `ids`: n tokens, and its `top` tokens per step."""
    import numpy as np
    llm.reset()
    llm.eval(ids)
    gen, best_lists = [], []
    for _ in range(n):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        best = np.argsort(-logits, kind="stable")[:top]
        best_lists.append([[int(t), float(logits[t])] for t in best])
        gen.append(int(best[0]))
        llm.eval([int(best[0])])
    return gen, best_lists
