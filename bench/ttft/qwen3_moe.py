"""Qwen3-MoE in plain PyTorch over a vLLM-style paged KV pool, for bench/ttft/ttft.py.

The weights are random, drawn on the device from a fixed seed (no checkpoint can be downloaded
on the GPU machine); the shapes are Qwen3-30B-A3B's, read back from transformers'
Qwen3MoeConfig. The KV pool is one tensor per layer, shaped as vLLM's flash-attention layout
(2, num_pages, 16, kv_heads, head_dim): K pages, then V pages. A request holds a block table of
page ids; attention gathers the request's pages (through the block table) before SDPA, in every
mode alike.

Every kernel used is deterministic for fixed shapes (no atomics: the MoE combine is a gather and
a sum, the KV write an index_put of distinct slots), so the same chunk of the same prompt
computes the same bytes each time. A request whose prefix KV was loaded from the store then
produces exactly the tokens of one that recomputed it, if and only if the store returned exact
bytes: the benchmark's greedy-token check rests on that.
"""
import math

import torch
import torch.nn.functional as F

PAGE_TOKENS = 16

# Qwen3-30B-A3B (and Qwen3-Coder-30B-A3B: the same shapes), as its config.json states them.
QWEN3_30B_A3B = {
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
}

# A model small enough for CI's CPU (tests/python/test_ttft.py): the same code, other shapes.
TINY = dict(QWEN3_30B_A3B, vocab_size=512, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
            max_position_embeddings=4096)


def build_config(values):
    """`values` as transformers' Qwen3MoeConfig holds them (each one read back from it), and
    where they came from. Without transformers the stated values are used, and said so."""
    try:
        import transformers
        from transformers import Qwen3MoeConfig
    except Exception as e:  # noqa: BLE001 (any import failure: the stated values stand)
        return dict(values), f"stated values (transformers not importable: {type(e).__name__})"
    kw = {k: v for k, v in values.items() if k != "rope_theta"}
    theta = values["rope_theta"]
    try:  # transformers 5 keeps RoPE's settings in rope_parameters
        cfg = Qwen3MoeConfig(rope_parameters={"rope_type": "default", "rope_theta": theta}, **kw)
    except TypeError:
        cfg = Qwen3MoeConfig(rope_theta=theta, **kw)
    out = {}
    for k in values:
        if k == "rope_theta":
            rp = getattr(cfg, "rope_parameters", None)
            v = rp.get("rope_theta") if isinstance(rp, dict) else None
            out[k] = float(v if v is not None else cfg.rope_theta)
        else:
            out[k] = getattr(cfg, k)
    if getattr(cfg, "mlp_only_layers", []) or getattr(cfg, "decoder_sparse_step", 1) != 1:
        raise ValueError("this model makes every layer a MoE layer, as Qwen3-30B-A3B does")
    return out, f"transformers {transformers.__version__} Qwen3MoeConfig"


def kv_bytes_per_token(c, dtype=torch.bfloat16):
    esize = torch.tensor([], dtype=dtype).element_size()
    return c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * c["head_dim"] * esize


def param_count(c):
    h, e, i = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"]
    nh, kvh, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    attn = h * nh * hd + 2 * h * kvh * hd + nh * hd * h + 2 * hd + 2 * h
    moe = h * e + e * 3 * h * i
    return c["num_hidden_layers"] * (attn + moe) + 2 * c["vocab_size"] * h + h


class PagedPool:
    """The KV pool: per layer a (2, pages, 16, kv_heads, head_dim) tensor, and a free list from
    which a request takes pages in random order (fresh pages land anywhere, as in an engine
    that has run a while)."""

    def __init__(self, c, pages, device, dtype, seed):
        shape = (2, pages, PAGE_TOKENS, c["num_key_value_heads"], c["head_dim"])
        self.layers = [torch.zeros(shape, device=device, dtype=dtype)
                       for _ in range(c["num_hidden_layers"])]
        self.pages = pages
        self.gen = torch.Generator().manual_seed(seed)
        self.free = torch.randperm(pages, generator=self.gen).tolist()

    def page_bytes(self):
        return self.layers[0][0, 0].numel() * self.layers[0].element_size()

    def alloc(self, n):
        """n pages off the free list, which release keeps in random order: O(n)."""
        if n > len(self.free):
            raise RuntimeError(f"the KV pool has {len(self.free)} free pages, {n} wanted")
        taken = self.free[len(self.free) - n:]
        del self.free[len(self.free) - n:]
        return taken

    def release(self, ids, poison=False):
        """Returns pages (outside any timed part: it reshuffles the free list). poison fills them
        with NaN first, so that a later load that leaves a page unwritten cannot pass."""
        if poison:
            idx = torch.tensor(ids, device=self.layers[0].device)
            for t in self.layers:
                t.index_fill_(1, idx, float("nan"))
        self.free.extend(ids)
        order = torch.randperm(len(self.free), generator=self.gen).tolist()
        self.free = [self.free[i] for i in order]

    def gather(self, ids):
        """The pages' K and V of every layer, as one contiguous tensor (a copy)."""
        idx = torch.tensor(ids, device=self.layers[0].device)
        return torch.stack([t.index_select(1, idx) for t in self.layers])

    def regions(self, page_region):
        """The store's regions, K then V of each layer: (base, page_bytes, stride, npages)."""
        return [page_region(t[kv]) for t in self.layers for kv in (0, 1)]

    def registered(self):
        return [(t.data_ptr(), t.numel() * t.element_size()) for t in self.layers]


def _rms_norm(x, w, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Qwen3Moe:
    def __init__(self, c, device, dtype=torch.bfloat16, seed=0):
        self.c = c
        self.device = torch.device(device)
        self.dtype = dtype
        h, e, i = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"]
        nh, kvh, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        g = torch.Generator(device=self.device)
        g.manual_seed(seed)

        def rnd(*shape, std=0.02):
            t = torch.empty(shape, device=self.device, dtype=dtype)
            if dtype == torch.float32 or self.device.type == "cuda":
                return t.normal_(0.0, std, generator=g)
            return t.copy_(torch.empty(shape, device=self.device).normal_(0.0, std, generator=g))

        def ones(n):
            return torch.ones(n, device=self.device, dtype=dtype)

        self.embed = rnd(c["vocab_size"], h)
        self.layers = []
        for _ in range(c["num_hidden_layers"]):
            self.layers.append({
                "ln1": ones(h), "ln2": ones(h), "qn": ones(hd), "kn": ones(hd),
                "wq": rnd(h, nh * hd), "wk": rnd(h, kvh * hd), "wv": rnd(h, kvh * hd),
                "wo": rnd(nh * hd, h), "router": rnd(h, e),
                "w_gu": rnd(e, h, 2 * i), "w_down": rnd(e, i, h),
            })
        self.norm = ones(h)
        self.lm_head = rnd(h, c["vocab_size"])
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        pos = torch.arange(c["max_position_embeddings"], dtype=torch.float64)
        freqs = torch.cat([torch.outer(pos, inv)] * 2, dim=-1)
        self.cos = freqs.cos().float().to(self.device)
        self.sin = freqs.sin().float().to(self.device)
        self.expert_ids = torch.arange(e, device=self.device)
        self.grouped_mm = self._probe_grouped_mm()
        self.sdpa = hasattr(F, "scaled_dot_product_attention")
        try:  # the long causal chunk must take a fused kernel: the math one would need the
            # whole score matrix (24K x 24K x 32 heads)
            from torch.nn.attention import SDPBackend, sdpa_kernel
            self.fused_only = lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION,
                                                   SDPBackend.EFFICIENT_ATTENTION])
        except ImportError:
            self.fused_only = None

    def _probe_grouped_mm(self):
        """torch._grouped_mm (one launch for all experts) where this torch and device have it,
        else a loop over the experts: either way the same in every mode of one run."""
        if self.device.type != "cuda" or not hasattr(torch, "_grouped_mm"):
            return False
        try:
            a = torch.ones(4, 16, device=self.device, dtype=self.dtype)
            b = torch.ones(2, 16, 16, device=self.device, dtype=self.dtype)
            offs = torch.tensor([1, 4], device=self.device, dtype=torch.int32)
            torch._grouped_mm(a, b, offs=offs)
            return True
        except Exception:  # noqa: BLE001 (not on this device or build: loop instead)
            return False

    def _experts(self, xs, w, offs):
        if self.grouped_mm:
            return torch._grouped_mm(xs, w, offs=offs)
        out = torch.empty(xs.shape[0], w.shape[2], device=xs.device, dtype=xs.dtype)
        start = 0
        for e, end in enumerate(offs.tolist()):
            if end > start:
                out[start:end] = xs[start:end] @ w[e]
            start = end
        return out

    def _moe(self, x, L):
        c = self.c
        k = c["num_experts_per_tok"]
        probs = (x @ L["router"]).float().softmax(dim=-1)
        w, ids = probs.topk(k, dim=-1)
        if c["norm_topk_prob"]:
            w = w / w.sum(dim=-1, keepdim=True)
        flat = ids.reshape(-1)
        sorted_ids, order = torch.sort(flat, stable=True)
        xs = x[order // k]
        # Each expert's end in the sorted rows, without a host sync (bincount reads back its
        # range on CUDA).
        offs = torch.searchsorted(sorted_ids, self.expert_ids, right=True).to(torch.int32)
        gate, up = self._experts(xs, L["w_gu"], offs).chunk(2, dim=-1)
        y = self._experts(F.silu(gate) * up, L["w_down"], offs)
        out = torch.empty_like(y)
        out[order] = y  # distinct rows: deterministic
        out = out.view(x.shape[0], k, -1).float() * w.unsqueeze(-1)
        return out.sum(dim=1).to(x.dtype)

    def _attend(self, q, K, V, mask, causal):
        """q (T, heads, hd); K, V (S, kv_heads, hd): GQA by repeating K and V to every head
        (SDPA's flash kernel then serves the long causal chunk)."""
        rep = q.shape[1] // K.shape[1]
        qh = q.transpose(0, 1).unsqueeze(0)
        kh = K.repeat_interleave(rep, dim=1).transpose(0, 1).unsqueeze(0)
        vh = V.repeat_interleave(rep, dim=1).transpose(0, 1).unsqueeze(0)
        if self.sdpa and causal and self.fused_only is not None and q.is_cuda:
            with self.fused_only():
                o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        elif self.sdpa:
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=causal)
        else:  # old torch (CI's Debian 1.13): the same arithmetic, unfused
            s = (qh.float() @ kh.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
            if causal:
                mask = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            o = (s.softmax(dim=-1) @ vh.float()).to(q.dtype)
        return o[0].transpose(0, 1).reshape(q.shape[0], -1)

    @torch.no_grad()
    def forward(self, tokens, start, pool, block_table):
        """Runs tokens (a 1-D device tensor) at positions start.. over the request's pages
        (block_table: a device tensor of page ids covering every position so far): writes their
        K and V into the pool, attends over the request's KV, and returns the logits of the last
        position (float32)."""
        c = self.c
        n = tokens.shape[0]
        end = start + n
        kvh, hd = c["num_key_value_heads"], c["head_dim"]
        pos = torch.arange(start, end, device=self.device)
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)
        slots = block_table[pos // PAGE_TOKENS] * PAGE_TOKENS + pos % PAGE_TOKENS
        pages = block_table[:(end + PAGE_TOKENS - 1) // PAGE_TOKENS]
        causal = n > 1 and start == 0
        mask = None
        if n > 1 and start > 0:  # a later chunk: each query sees the prefix and its own past
            mask = torch.arange(end, device=self.device).unsqueeze(0) <= pos.unsqueeze(1)
        h = self.embed[tokens]
        eps = c["rms_norm_eps"]
        for li, L in enumerate(self.layers):
            x = _rms_norm(h, L["ln1"], eps)
            q = _rms_norm((x @ L["wq"]).view(n, -1, hd), L["qn"], eps)
            k = _rms_norm((x @ L["wk"]).view(n, kvh, hd), L["kn"], eps)
            v = (x @ L["wv"]).view(n, kvh, hd)
            q = (q.float() * cos + _rotate_half(q.float()) * sin).to(self.dtype)
            k = (k.float() * cos + _rotate_half(k.float()) * sin).to(self.dtype)
            kc, vc = pool.layers[li][0], pool.layers[li][1]
            kc.view(-1, kvh, hd)[slots] = k
            vc.view(-1, kvh, hd)[slots] = v
            K = kc[pages].reshape(-1, kvh, hd)[:end]
            V = vc[pages].reshape(-1, kvh, hd)[:end]
            h = h + self._attend(q, K, V, mask, causal) @ L["wo"]
            h = h + self._moe(_rms_norm(h, L["ln2"], eps), L)
        return (_rms_norm(h[-1:], self.norm, eps) @ self.lm_head).float()[0]
