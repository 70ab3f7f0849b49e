"""The same Llama-shaped step in PyTorch, for comparison: fp16, batch 1, a static KV cache of n_kv cells with
a mask, embedding and lm_head included; eager and one torch.cuda.CUDAGraph replay. torch is imported only
here and only when asked; without it (or without a CUDA device) the results say so and carry no times."""

from __future__ import annotations

import statistics
import time

from ..model.presets import ModelConfig
from .timing import percentile

REPS, WARMUP = 30, 5


def _torch():
    """(torch, None) or (None, why not)."""
    try:
        import torch
    except ImportError:
        return None, "absent"
    if not torch.cuda.is_available():
        return None, "no CUDA device"
    return torch, None


class _Model:
    """Random fp16 weights of the preset's shapes on the GPU (values do not matter for timing)."""

    def __init__(self, torch, cfg: ModelConfig, n_cells: int):
        self.t, self.cfg = torch, cfg
        dev, h = "cuda", torch.float16
        d, dkv, f = cfg.n_embd, cfg.n_embd_kv, cfg.n_ff

        def w(*shape):
            return torch.randn(*shape, device=dev, dtype=h) / shape[-1] ** 0.5
        self.emb, self.out, self.out_norm = w(cfg.n_vocab, d), w(cfg.n_vocab, d), torch.ones(d, device=dev, dtype=h)
        self.layers = [dict(n1=torch.ones(d, device=dev, dtype=h), q=w(d, d), k=w(dkv, d), v=w(dkv, d), o=w(d, d),
                            n2=torch.ones(d, device=dev, dtype=h), g=w(f, d), u=w(f, d), dn=w(d, f))
                       for _ in range(cfg.n_layer)]
        shape = (1, cfg.n_head_kv, n_cells, cfg.head_dim)
        self.kc = [torch.zeros(shape, device=dev, dtype=h) for _ in range(cfg.n_layer)]
        self.vc = [torch.zeros(shape, device=dev, dtype=h) for _ in range(cfg.n_layer)]
        hd = cfg.head_dim
        inv = 1.0 / (cfg.rope_base ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd))
        ang = torch.arange(cfg.n_ctx, device=dev, dtype=torch.float32)[:, None] * inv[None]
        self.cos, self.sin = ang.cos().to(h), ang.sin().to(h)

    def _rms(self, x, w):
        x32 = x.float()
        return (x32 * self.t.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)).to(x.dtype) * w

    def _rope(self, x, pos):   # x (1, H, T, D), adjacent pairs as ggml's mode 0
        c, s = self.cos[pos][None, None], self.sin[pos][None, None]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return self.t.stack((x0 * c - x1 * s, x0 * s + x1 * c), -1).flatten(-2)

    def forward(self, tokens, pos, mask):
        """tokens, pos: (T,) int64 tensors; mask (T, n_cells) fp16 (0 / -inf). Logits of the last token."""
        F, cfg = self.t.nn.functional, self.cfg
        T, H, Hkv, D = tokens.shape[0], cfg.n_head, cfg.n_head_kv, cfg.head_dim
        x = self.emb[tokens]
        for i, L in enumerate(self.layers):
            h = self._rms(x, L["n1"])
            q = F.linear(h, L["q"]).view(T, H, D).transpose(0, 1)[None]
            k = F.linear(h, L["k"]).view(T, Hkv, D).transpose(0, 1)[None]
            v = F.linear(h, L["v"]).view(T, Hkv, D).transpose(0, 1)[None]
            q, k = self._rope(q, pos), self._rope(k, pos)
            self.kc[i].index_copy_(2, pos, k)
            self.vc[i].index_copy_(2, pos, v)
            a = F.scaled_dot_product_attention(q, self.kc[i], self.vc[i], attn_mask=mask[None, None],
                                               enable_gqa=H != Hkv)
            x = x + F.linear(a[0].transpose(0, 1).reshape(T, H * D), L["o"])
            h = self._rms(x, L["n2"])
            x = x + F.linear(F.silu(F.linear(h, L["g"])) * F.linear(h, L["u"]), L["dn"])
        return F.linear(self._rms(x[-1:], self.out_norm), self.out)


def _mask(torch, n_cells: int, pos0: int, n: int):
    cells = torch.arange(n_cells, device="cuda")[None]
    rows = torch.arange(pos0, pos0 + n, device="cuda")[:, None]
    m = torch.zeros(n, n_cells, device="cuda", dtype=torch.float16)
    return m.masked_fill(cells > rows, float("-inf"))


def _timed(torch, fn, reps: int = REPS, warmup: int = WARMUP) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter_ns() - t0) / 1e6)
    return out


def torch_decode(cfg: ModelConfig, n_kv: int, pos: int) -> dict:
    """One decode token at position `pos` over a static cache of n_kv cells: eager and CUDA-graph times (ms)."""
    torch, why = _torch()
    if torch is None:
        return {"torch": why}
    with torch.inference_mode():
        m = _Model(torch, cfg, n_kv)
        tok = torch.ones(1, device="cuda", dtype=torch.long)
        p = torch.full((1,), pos, device="cuda", dtype=torch.long)
        mask = _mask(torch, n_kv, pos, 1)
        eager = _timed(torch, lambda: m.forward(tok, p, mask))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                m.forward(tok, p, mask)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            m.forward(tok, p, mask)
        graph = _timed(torch, g.replay)
        del g
    return {"torch": torch.__version__, "torch_eager_ms": statistics.median(eager),
            "torch_eager_p90_ms": percentile(eager, 90), "torch_graph_ms": statistics.median(graph),
            "torch_graph_p90_ms": percentile(graph, 90)}


def torch_prefill(cfg: ModelConfig, n_tokens: int, positions: list[int]) -> dict:
    """Prefills of n_tokens starting at each of `positions` (the same cells graphdiag's timed prefills
    use), eager; the median over positions and repetitions, in ms."""
    torch, why = _torch()
    if torch is None:
        return {"torch": why}
    n_cells = max(positions) + n_tokens
    with torch.inference_mode():
        m = _Model(torch, cfg, n_cells)
        tok = torch.ones(n_tokens, device="cuda", dtype=torch.long)
        times = []
        for p0 in positions:
            pos = torch.arange(p0, p0 + n_tokens, device="cuda")
            mask = _mask(torch, n_cells, p0, n_tokens)
            times += _timed(torch, lambda: m.forward(tok, pos, mask), reps=5, warmup=2)
    return {"torch": torch.__version__, "torch_prefill_ms": statistics.median(times)}
