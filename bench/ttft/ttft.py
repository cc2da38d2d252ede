#!/usr/bin/env python3
"""Time to first token with Qwen3-30B-A3B's shapes on one GPU: recompute, load direct, load staged.

A prefill of each prompt computes its KV into a paged pool (bench/ttft/qwen3_moe.py), writes the
whole 16-token pages of it to kvstash (batch_put_from_pages, 256 tokens a key, the last key
partial), and frees the pool's pages. Later requests with the same prompt then take a mode:

  recompute    no cache: a prefill of the cached prefix
  direct       batch_get_into_multi_buffers of the prefix's keys into fresh, randomly permuted
               pages, a pointer per page and region (one copy per page: MC_STORE_GPU_STAGING=0)
  staged       the same call with MC_STORE_GPU_STAGING=1 (one contiguous GPU buffer per fill,
               one scatter kernel per fill)
  *-pages      direct-pages, staged-pages: batch_get_into_pages, the regions named once and
               page ids per key, instead of pointers
  pinned H2D   not a request: one pinned host tensor of the prefix's KV bytes copied to the
               device, the limit for the load

and then, in every mode, the prefill of the remaining tokens (the last partial page) and the
first token. TTFT runs from the request's start to that token (CUDA synchronised); the load
part is the time to the end of the recompute or of the store's read. The owner is a separate
kvstash-server process; each transport (shm, tcp) has a direct and a staged client.

Correctness: in the warm-up round every mode, length and transport is checked against the
request that stored the KV, outside the timed part: the prefix's pages byte for byte, the first
token's logits bit for bit, and --decode greedy tokens; the run fails on any difference. Freed
pages are filled with NaN first, so a page a load leaves unwritten cannot pass. The storing
request computed the prefix in the same chunk as recompute does, so recompute must match too
(the model's kernels are deterministic for fixed shapes).

    PYTHONPATH=build-gpu/python python3 bench/ttft/ttft.py --server build-gpu/kvstash-server \
        --lengths 1024,8192,24576 --rounds 5 --markdown out/ttft.md
"""
import argparse
import hashlib
import json
import os
import statistics
import sys
import time

import torch

import kvstash

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_common import open_store, start_server  # noqa: E402
from qwen3_moe import (PAGE_TOKENS, QWEN3_30B_A3B, TINY, PagedPool, Qwen3Moe,  # noqa: E402
                       build_config, kv_bytes_per_token, param_count)

KEY_TOKENS = 256
KEY_PAGES = KEY_TOKENS // PAGE_TOKENS


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Prompt:
    """One prompt: its tokens, how many of them the store caches (whole pages, all but the last
    token's page), and the keys of those pages: a hash chain over 256-token blocks, as an
    engine's prefix cache names them."""

    def __init__(self, length, vocab, seed, tag):
        g = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (length,), generator=g)
        self.length = length
        self.cached = (length - 1) // PAGE_TOKENS * PAGE_TOKENS
        self.keys, self.key_pages = [], []
        prev = tag.encode()
        for t0 in range(0, self.cached, KEY_TOKENS):
            t1 = min(t0 + KEY_TOKENS, self.cached)
            prev = hashlib.sha256(prev + self.tokens[t0:t1].numpy().tobytes()).digest()
            self.keys.append("ttft-" + prev.hex()[:40])
            self.key_pages.append((t1 - t0) // PAGE_TOKENS)

    def page_ids(self, table):
        """Per key, its pages of the request's block table."""
        out, p = [], 0
        for n in self.key_pages:
            out.append(table[p:p + n])
            p += n
        return out


class Bench:
    def __init__(self, a, cfg):
        self.a = a
        self.c = cfg
        self.device = torch.device(a.device)
        self.dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
        t0 = time.perf_counter()
        self.model = Qwen3Moe(cfg, self.device, self.dtype, seed=a.seed)
        sync(self.device)
        self.init_s = time.perf_counter() - t0
        longest = max(a.lengths) + a.decode
        pages = a.pool_pages or 2 * ((longest + PAGE_TOKENS - 1) // PAGE_TOKENS) + 64
        self.pool = PagedPool(cfg, pages, self.device, self.dtype, seed=a.seed + 1)
        self.regions = self.pool.regions(kvstash.page_region)
        self.key_bytes_per_page = self.pool.page_bytes() * len(self.regions)
        self.ref = {}
        self.prompts = {n: Prompt(n, cfg["vocab_size"], a.seed + 2 + i, f"{a.seed}-{n}")
                        for i, n in enumerate(a.lengths)}

    def register(self, store):
        for ptr, n in self.pool.registered():
            if store.register_buffer(ptr, n) != 0:
                raise RuntimeError("register_buffer of the KV pool failed")

    def new_table(self, prompt):
        ids = self.pool.alloc((prompt.length + self.a.decode + PAGE_TOKENS - 1) // PAGE_TOKENS)
        return ids, torch.tensor(ids, device=self.device)

    def finish(self, prompt, table, decode):
        """The remaining tokens' prefill and the first token; with decode, the greedy tokens
        after it (outside the TTFT). Returns the tokens and the first token's logits."""
        toks = prompt.tokens.to(self.device)
        logits = self.model.forward(toks[prompt.cached:], prompt.cached, self.pool, table)
        out = [int(logits.argmax())]  # synchronises
        for i in range(1, decode):
            t = torch.tensor([out[-1]], device=self.device)
            out.append(int(self.model.forward(t, prompt.length + i - 1, self.pool,
                                              table).argmax()))
        return out, logits

    def pointers(self, per_key_ids):
        """Per key, the address and size of each page of every region in turn (the page-table
        form's 'page' order, which the keys were stored in)."""
        regs = [(base, stride) for base, _, stride, _ in self.regions]
        page = self.pool.page_bytes()
        ptrs = [[base + i * stride for i in ids for base, stride in regs] for ids in per_key_ids]
        return ptrs, [[page] * len(p) for p in ptrs]

    def recompute_prefix(self, prompt, table):
        self.model.forward(prompt.tokens[:prompt.cached].to(self.device), 0, self.pool, table)

    def store_prompt(self, store, prompt):
        """The first request: computes the prompt, keeps its greedy tokens, writes its whole
        pages to the store, frees its pages."""
        ids, table = self.new_table(prompt)
        self.recompute_prefix(prompt, table)
        tokens, logits = self.finish(prompt, table, self.a.decode)
        sync(self.device)
        t0 = time.perf_counter()
        res = store.batch_put_from_pages(prompt.keys, self.regions, prompt.page_ids(ids), "page")
        put_ms = (time.perf_counter() - t0) * 1e3
        if any(r != 0 for r in res):
            raise RuntimeError(f"batch_put_from_pages: {sorted(set(res))}")
        self.ref[prompt.length] = (self.pool.gather(ids[:prompt.cached // PAGE_TOKENS]), logits,
                                   tokens)
        self.pool.release(ids, poison=True)
        return tokens, put_ms

    def check(self, prompt, ids, logits, tokens):
        """Round 0's checks against the storing request, outside the timed part: the prefix's
        pages byte for byte (the store's bytes, and recompute's determinism), the first token's
        logits bit for bit, then the greedy tokens. Returns what differed ('' when nothing)."""
        pages, ref_logits, ref_tokens = self.ref[prompt.length]
        got = self.pool.gather(ids[:prompt.cached // PAGE_TOKENS])
        # Compared as bytes: NaN (a poisoned page left unwritten) never equals, and -0.0 != 0.0.
        if not torch.equal(got.view(torch.uint8), pages.view(torch.uint8)):
            bad = (got.view(torch.uint8) != pages.view(torch.uint8)).flatten(3).any(-1)
            return f"prefix KV differs in {int(bad.sum())} (layer, K/V, page) pages"
        if not torch.equal(logits.view(torch.int32), ref_logits.view(torch.int32)):  # float32
            return "first-token logits differ"
        if tokens != ref_tokens:
            return f"greedy tokens differ: {tokens} != {ref_tokens}"
        return ""

    def request(self, prompt, mode, store, decode):
        """One request in `mode`: (ttft ms, load ms, what differed or None); self.lists_ms holds
        the part of the load that built the pointer lists (0 for the other modes)."""
        sync(self.device)
        self.lists_ms = 0.0
        t0 = time.perf_counter()
        ids, table = self.new_table(prompt)
        if mode == "recompute":
            self.recompute_prefix(prompt, table)
        else:
            if mode.endswith("-pages"):
                res = store.batch_get_into_pages(prompt.keys, self.regions,
                                                 prompt.page_ids(ids), "page")
            else:  # Mooncake's call: a pointer and a size per page and region
                tl = time.perf_counter()
                ptrs, sizes = self.pointers(prompt.page_ids(ids))
                self.lists_ms = (time.perf_counter() - tl) * 1e3
                res = store.batch_get_into_multi_buffers(prompt.keys, ptrs, sizes)
            want = [n * self.key_bytes_per_page for n in prompt.key_pages]
            if res != want:
                raise RuntimeError(f"{mode}: batch_get_into_pages returned {res[:4]}...")
        sync(self.device)
        t1 = time.perf_counter()
        tokens, logits = self.finish(prompt, table, decode)
        t2 = time.perf_counter()
        why = self.check(prompt, ids, logits, tokens) if decode else None
        self.pool.release(ids, poison=bool(decode))
        # With decode the time to t2 holds the later tokens too: not a TTFT.
        return (t2 - t0) * 1e3, (t1 - t0) * 1e3, why

    def pinned_h2d_ms(self, nbytes):
        """One pinned host-to-device copy of nbytes: the limit of a load of that many."""
        if not hasattr(self, "h2d_host"):
            most = max(p.cached for p in self.prompts.values()) * kv_bytes_per_token(self.c,
                                                                                   self.dtype)
            self.h2d_host = torch.empty(most, dtype=torch.uint8).pin_memory()
            self.h2d_dev = torch.empty(most, dtype=torch.uint8, device=self.device)
        sync(self.device)
        t0 = time.perf_counter()
        self.h2d_dev[:nbytes].copy_(self.h2d_host[:nbytes], non_blocking=True)
        sync(self.device)
        return (time.perf_counter() - t0) * 1e3


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default="kvstash-server")
    ap.add_argument("--lengths", default="1024,8192,24576",
                    help="input lengths in tokens (comma-separated)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="timed rounds (after one warm-up round that also checks tokens)")
    ap.add_argument("--protocols", default="shm,tcp")
    ap.add_argument("--modes", default="recompute,direct,staged,staged-pages",
                    help="recompute; direct and staged read with batch_get_into_multi_buffers "
                    "(a pointer per page), direct-pages and staged-pages with "
                    "batch_get_into_pages (page ids)")
    ap.add_argument("--decode", type=int, default=32, help="greedy tokens checked per mode")
    ap.add_argument("--model", default="qwen3-30b-a3b", choices=["qwen3-30b-a3b", "tiny"])
    ap.add_argument("--layers", type=int, help="override the layer count (a smaller model)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--pool-pages", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--markdown", help="append the result tables to this file")
    ap.add_argument("--json", help="write every measurement to this file")
    a = ap.parse_args(argv)
    a.lengths = [int(x) for x in a.lengths.split(",")]
    a.protocols = a.protocols.split(",")
    a.modes = a.modes.split(",")
    for m in a.modes:
        if m not in ("recompute", "direct", "staged", "direct-pages", "staged-pages"):
            ap.error(f"unknown mode {m}")
    if min(a.lengths) <= PAGE_TOKENS:
        ap.error(f"lengths must exceed {PAGE_TOKENS} tokens (one page stays uncached)")
    if a.decode < 1:
        ap.error("--decode must be at least 1")
    if a.rounds < 1:
        ap.error("--rounds must be at least 1 (round 0 only warms up and checks)")
    return a


def main():
    a = parse_args()
    stated = dict(QWEN3_30B_A3B if a.model == "qwen3-30b-a3b" else TINY)
    if a.layers:
        stated["num_hidden_layers"] = a.layers
    cfg, source = build_config(stated)
    if max(a.lengths) + a.decode > cfg["max_position_embeddings"]:
        sys.exit("a length past the model's max_position_embeddings")
    if any(m.startswith("staged") for m in a.modes) and not a.device.startswith("cuda"):
        sys.exit("staged loads need a CUDA device (--device cuda)")
    b = Bench(a, cfg)
    kvt = kv_bytes_per_token(cfg, b.dtype)
    dev_name = torch.cuda.get_device_name(b.device) if b.device.type == "cuda" else "CPU"
    print(f"model: {a.model}, {cfg['num_hidden_layers']} layers, {cfg['num_key_value_heads']} KV "
          f"heads x {cfg['head_dim']}, {cfg['num_experts']} experts ({cfg['num_experts_per_tok']}"
          f" active), {param_count(cfg) / 1e9:.2f} B parameters, {a.dtype}, from {source}; "
          f"KV {kvt} B/token; random weights (seed {a.seed}) built in {b.init_s:.1f} s on "
          f"{dev_name}; experts {'torch._grouped_mm' if b.model.grouped_mm else 'a loop'}",
          flush=True)
    total = sum(p.cached for p in b.prompts.values()) * kvt
    # Room below the master's eviction watermark (0.90): no stored key may be evicted.
    proc, master = start_server(a.server, str(int(total / 0.85) + (256 << 20)), wait_s=30.0,
                                extra=("--no-metrics",))
    try:
        return run(a, b, cfg, kvt, master, dev_name, source)
    finally:
        proc.terminate()
        proc.wait(10)


def run(a, b, cfg, kvt, master, dev_name, source):
    stores = {}
    for proto in a.protocols:
        for mode in a.modes:
            if mode != "recompute":
                stores[(proto, mode)] = open_store(
                    master, "1" if mode.startswith("staged") else "0", proto)
                b.register(stores[(proto, mode)])
    writer = open_store(master, "0", a.protocols[0])
    b.register(writer)
    want, puts = {}, {}
    for n, p in b.prompts.items():
        want[n], puts[n] = b.store_prompt(writer, p)
        print(f"stored {n} tokens: {len(p.keys)} keys, {p.cached * kvt / 2**20:.1f} MiB in "
              f"{puts[n]:.0f} ms; greedy tokens {want[n][:8]}...", flush=True)
    keys = [k for p in b.prompts.values() for k in p.keys]
    if writer.batch_is_exist(keys) != [1] * len(keys):
        raise RuntimeError("stored keys are missing (evicted?): the segment is too small")
    cells = [(proto, n, m) for proto in a.protocols for n in a.lengths for m in a.modes]
    ttft = {c: [] for c in cells}
    load = {c: [] for c in cells}
    lists = {c: [] for c in cells}
    h2d = {n: [] for n in a.lengths}
    mismatch = []
    for r in range(a.rounds + 1):  # round 0 warms up and checks the tokens
        lengths = a.lengths if r % 2 == 0 else a.lengths[::-1]
        for n in lengths:
            p = b.prompts[n]
            if b.device.type == "cuda":
                h2d[n].append(b.pinned_h2d_ms(p.cached * kvt))
            for proto in a.protocols:
                modes = a.modes[r % len(a.modes):] + a.modes[:r % len(a.modes)]
                for m in modes:
                    store = stores.get((proto, m))
                    t, ld, why = b.request(p, m, store, a.decode if r == 0 else 0)
                    if r == 0:
                        print(f"check {proto} {n} {m}: " + (
                            f"same prefix KV bytes, first-token logits and {a.decode} greedy "
                            "tokens" if not why else "DIFFERENT: " + why), flush=True)
                        if why:
                            mismatch.append((proto, n, m, why))
                    else:
                        ttft[(proto, n, m)].append(t)
                        load[(proto, n, m)].append(ld)
                        lists[(proto, n, m)].append(b.lists_ms)
        if r:
            print(f"round {r}/{a.rounds} done", flush=True)
    # A staged client that fell back would read the same bytes: it must really have staged.
    for (proto, m), st in stores.items():
        stats = st.get_stats()
        falls = {k: v for k, v in stats.items() if k.startswith("fallback_") and v}
        if m.startswith("staged") and (falls or not stats.get("staged_reads")):
            mismatch.append((proto, "-", m, f"not staged: {stats.get('staged_reads')} staged "
                             f"reads, fallbacks {falls}"))
        elif m.startswith("staged"):
            print(f"{proto} {m}: {stats['staged_reads']} staged reads, {stats['fills']} fills "
                  f"({stats['fills'] / stats['staged_reads']:.1f} per read), no fallback",
                  flush=True)
        elif stats.get("staged_reads"):
            mismatch.append((proto, "-", m, "a direct client staged"))
    lines = report(a, b, cfg, kvt, dev_name, source, ttft, load, lists, h2d, puts, mismatch)
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        with open(a.markdown, "a") as f:
            f.write(text + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": cfg, "ttft_ms": {"/".join(map(str, k)): v for k, v in ttft.items()},
                       "load_ms": {"/".join(map(str, k)): v for k, v in load.items()},
                       "pointer_lists_ms": {"/".join(map(str, k)): v for k, v in lists.items()},
                       "pinned_h2d_ms": h2d, "put_ms": puts}, f, indent=1)
    for s in list(stores.values()) + [writer]:
        s.close()
    if mismatch:
        for proto, n, m, why in mismatch:
            print(f"FAILED: {proto} {n} tokens {m}: {why}")
        return 1
    return 0


def report(a, b, cfg, kvt, dev_name, source, ttft, load, lists, h2d, puts, mismatch):
    med = {k: statistics.median(v) for k, v in ttft.items() if v}
    lmed = {k: statistics.median(v) for k, v in load.items() if v}
    direct = next((m for m in ("direct", "direct-pages") if m in a.modes), None)
    # Each staged mode against the direct one and recompute, and its load against the limit.
    ratios = [(s, base) for s in a.modes if s.startswith("staged")
              for base in (direct, "recompute") if base in a.modes]
    lines = [f"\nTTFT, {dev_name}, {a.model} ({cfg['num_hidden_layers']} layers, "
             f"{param_count(cfg) / 1e9:.1f} B parameters, {a.dtype}, {source}), KV {kvt} B per "
             f"token, {a.rounds} rounds after a warm-up, medians in ms",
             "",
             "| transport | input tokens | cached tokens | KV loaded (MiB) | "
             + " | ".join(f"{m} TTFT (load)" for m in a.modes) + " | pinned H2D | "
             + "".join(f"{s} / {base} | " for s, base in ratios)
             + "".join(f"{s} load / pinned H2D | " for s in a.modes if s.startswith("staged")),
             "|---|---|---|---|" + "---|" * (len(a.modes) + 1 + len(ratios))
             + "---|" * sum(m.startswith("staged") for m in a.modes)]
    for proto in a.protocols:
        for n in a.lengths:
            p = b.prompts[n]
            hm = statistics.median(h2d[n][1:]) if len(h2d[n]) > 1 else float("nan")
            row = [proto, str(n), str(p.cached), f"{p.cached * kvt / 2**20:.0f}"]
            row += [f"{med[(proto, n, m)]:.1f} ({lmed[(proto, n, m)]:.1f})" for m in a.modes]
            row.append(f"{hm:.2f}")
            row += [f"{med[(proto, n, s)] / med[(proto, n, base)]:.3f}" for s, base in ratios]
            row += [f"{lmed[(proto, n, s)] / hm:.3f}" for s in a.modes if s.startswith("staged")]
            lines.append("| " + " | ".join(row) + " |")
    pointer_modes = [m for m in a.modes if m in ("direct", "staged")]
    if pointer_modes:
        lines.append("")
        lines.append("Of each load, building the pointer lists in Python (medians, ms): " + "; ".join(
            f"{proto} {n} {m} {statistics.median(lists[(proto, n, m)]):.1f}"
            for proto in a.protocols for n in a.lengths for m in pointer_modes
            if lists[(proto, n, m)]))
    lines.append("")
    lines.append(f"Greedy check: {a.decode} tokens per mode, length and transport: "
                 + ("prefix KV bytes, first-token logits and tokens all identical to the "
                    "storing request's" if not mismatch
                    else f"{len(mismatch)} DIFFERENT"))
    lines.append("Stores (batch_put_from_pages, not in TTFT): "
                 + ", ".join(f"{n} tokens {ms:.0f} ms" for n, ms in puts.items()))
    return lines


if __name__ == "__main__":
    sys.exit(main())
