# Emulates one warp of the tiled decode (tiled-decode.patch) lane by lane: transposed reduction,
# one softmax step per tile and query head, P.V by broadcast; checks against plain softmax.
import numpy as np
rng = np.random.default_rng(1)

def run(D, BS, G, valid_list):
    kG = 1 if G <= 1 else 2 if G <= 2 else 4 if G <= 4 else 8
    kPairs = D // 64
    C0 = min(32 // kG, BS); C = min(C0, 16 // kPairs)
    V = kG * C; S = int(np.log2(V)); kRep = 32 // V; GL = 32 // kG
    q = rng.standard_normal((G, D)).astype(np.float32)
    blocks = [(rng.standard_normal((BS, D)).astype(np.float32), rng.standard_normal((BS, D)).astype(np.float32), v) for v in valid_list]
    scale = 1 / np.sqrt(D)
    # lane l owns pairs l*kPairs+i -> elements (p, p + D/2) (neox)
    def elems(l):
        out = []
        for i in range(kPairs):
            p = l * kPairs + i
            out += [p, p + D // 2]
        return out
    E = [elems(l) for l in range(32)]
    mx = np.full(kG, -np.inf); sm = np.zeros(kG); acc = np.zeros((32, kG, 2 * kPairs))
    for K, Vv, valid in blocks:
        for j0 in range(0, valid, C):
            sc = np.zeros((32, V))
            for l in range(32):
                for g in range(kG):
                    for c in range(C):
                        j = min(j0 + c, valid - 1)
                        sc[l, g * C + c] = sum(q[g, e] * K[j, e] for e in E[l]) if g < G else 0.0
            # transposed reduce
            n = V
            for st in range(S):
                o = 16 >> st; half = V >> (st + 1)
                new = sc.copy()
                for l in range(32):
                    up = (l & o) != 0
                    partner = l ^ o
                    for i in range(half):
                        send_p = sc[partner, i] if (partner & o) else sc[partner, i + half]
                        keep = sc[l, i + half] if up else sc[l, i]
                        new[l, i] = keep + send_p
                sc = new
            score = sc[:, 0].copy()
            o = 16 >> S
            while o > 0:
                score = score + score[np.arange(32) ^ o]; o >>= 1
            mine = np.arange(32) // kRep; my_g = mine // C; my_c = mine % C
            ok = (my_g < G) & (j0 + my_c < valid)
            score = np.where(ok, score * scale, -np.inf)
            tmax = score.copy(); o = 1
            while o < GL:
                tmax = np.maximum(tmax, tmax[np.arange(32) ^ o]); o <<= 1
            corr = np.zeros(kG); m_mine = np.full(32, -np.inf)
            for g in range(kG):
                tm = tmax[g * GL]; mn = max(mx[g], tm)
                corr[g] = 0.0 if mx[g] == -np.inf else np.exp(mx[g] - mn); mx[g] = mn
                m_mine = np.where(my_g == g, mn, m_mine)
            with np.errstate(invalid='ignore'):
                prob = np.where(score == -np.inf, 0.0, np.exp(score - m_mine))
            psum = np.where(np.arange(32) % kRep == 0, prob, 0.0); o = 1
            while o < GL:
                psum = psum + psum[np.arange(32) ^ o]; o <<= 1
            for g in range(kG):
                sm[g] = sm[g] * corr[g] + psum[g * GL]
                acc[:, g, :] *= corr[g]
                for c in range(C):
                    w = prob[(g * C + c) * kRep]
                    j = min(j0 + c, valid - 1)
                    for l in range(32):
                        acc[l, g, :] += w * Vv[j, E[l]]
    out = np.zeros((G, D))
    for l in range(32):
        for g in range(G):
            out[g, E[l]] = acc[l, g, :] / sm[g]
    # reference
    Ks = np.concatenate([K[:v] for K, _, v in blocks]); Vs = np.concatenate([Vv[:v] for _, Vv, v in blocks])
    s = (q @ Ks.T) * scale; p = np.exp(s - s.max(1, keepdims=True)); p /= p.sum(1, keepdims=True)
    ref = p @ Vs
    lse_ref = np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1)
    lse = mx[:G] + np.log(sm[:G])
    return np.abs(out - ref).max(), np.abs(lse - lse_ref).max()

for D, BS, G in [(128, 16, 4), (128, 32, 7), (64, 16, 1), (64, 32, 3), (128, 16, 2), (64, 16, 8), (128, 32, 1)]:
    e, el = run(D, BS, G, [BS, BS - 3, 5])
    print(D, BS, G, f"{e:.2e} {el:.2e}", "OK" if e < 1e-4 and el < 1e-4 else "FAIL")
