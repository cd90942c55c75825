#!/usr/bin/env python3
"""Writes a small GPTQ or AWQ checkpoint the way those tools publish them, for
tests/unit/quant_checkpoint_test.cc (run at test time into a temporary
directory that the test removes).

Packing follows the published formats (written here from their
descriptions, independently of the C++ reader):
- GPTQ (AutoGPTQ / transformers): qweight int32 [in * bits / 32, out], the
  codes of input rows i*(32/bits) + t in bits [t*bits, (t+1)*bits) of word
  i; qzeros int32 [groups, out * bits / 32] packed the same way along `out`,
  storing zero - 1 ("gptq", v1) or the zero ("gptq_v2"); scales fp16
  [groups, out]; g_idx int32 [in] (k // group_size, or a permutation's
  groups with desc_act).
- AWQ (AutoAWQ, version "gemm"): qweight int32 [in, out / 8] and qzeros int32
  [groups, out / 8], nibble t of a word holding column word*8 + order[t],
  order = [0, 2, 4, 6, 1, 3, 5, 7]; scales fp16 [groups, out].

Also writes expected.safetensors: per layer the codes [out, in], scales
[groups, out] (f32), zeros [groups, out] and g_idx [in] as packed, the prompt
"tokens" and "logits" [tokens, vocab] of a float64 Llama forward pass over
the dequantized weights W = scale * (code - zero).

usage: quant_checkpoint_writer.py OUT_DIR KIND
KIND: gptq4 | gptq8 | gptq8-pc | gptq4-pc | gptq4-actorder |
      gptq8-actorder | gptq4-asym | gptq4-asym-v2 | awq4 | awq4-g64 |
      gptq4-g128 (any kind may end in -gN: groups of N input rows) |
      bad-3bit | bad-shape | bad-no-scales | bad-actorder-no-gidx |
      bad-no-quant-config (packed tensors, no quantization config anywhere)
A kind ending in -sidefile writes the quantization config where AutoGPTQ
(quantize_config.json, no quant_method) or AutoAWQ (quant_config.json:
w_bit, q_group_size, version "GEMM") put it, config.json having none.
"""
import json
import os
import struct
import sys
import zlib

import numpy as np

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB = 64, 96, 2, 4, 2, 50
HEAD_DIM = HIDDEN // HEADS
EPS, THETA = 1e-5, 10000.0
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, numpy array)."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def pack_words(values, bits, axis, order=None):
    """Packs unsigned codes along `axis` into uint32 words (element t of a
    word at bits t*bits), in `order` (AWQ) or natural order."""
    per = 32 // bits
    v = np.moveaxis(values.astype(np.uint32), axis, -1)
    v = v.reshape(v.shape[:-1] + (v.shape[-1] // per, per))
    if order is not None:
        v = v[..., order]
    words = np.zeros(v.shape[:-1], dtype=np.uint32)
    for t in range(per):
        words |= v[..., t] << np.uint32(bits * t)
    return np.moveaxis(words, -1, axis).view(np.int32)


def quantize(w, bits, group, sym, g_idx, rng):
    """w [out, in] -> codes [out, in], scales (fp16) [groups, out], zeros
    [groups, out] (the zero points)."""
    out_f, in_f = w.shape
    groups = int(g_idx.max()) + 1
    maxq = (1 << bits) - 1
    scales = np.zeros((groups, out_f), np.float16)
    zeros = np.zeros((groups, out_f), np.int64)
    codes = np.zeros((out_f, in_f), np.int64)
    for g in range(groups):
        cols = np.nonzero(g_idx == g)[0]
        block = w[:, cols]
        if sym:
            amax = np.abs(block).max(axis=1)
            s = (2 * amax / maxq).astype(np.float16)
            z = np.full(out_f, (maxq + 1) // 2)
        else:
            lo = np.minimum(block.min(axis=1), 0)
            hi = np.maximum(block.max(axis=1), 0)
            s = ((hi - lo) / maxq).astype(np.float16)
            z = np.clip(np.round(-lo / s.astype(np.float64)), 0, maxq)
        s64 = s.astype(np.float64)
        q = np.clip(np.round(block / s64[:, None]) + z[:, None], 0, maxq)
        codes[:, cols] = q
        scales[g] = s
        zeros[g] = z
    return codes, scales, zeros


def rope(v, heads, positions):
    inv = 1.0 / THETA ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    ang = np.outer(positions, inv)
    c, s = np.cos(ang), np.sin(ang)
    v = v.reshape(len(positions), heads, HEAD_DIM)
    x1, x2 = v[..., : HEAD_DIM // 2], v[..., HEAD_DIM // 2:]
    out = np.concatenate([x1 * c[:, None] - x2 * s[:, None],
                          x2 * c[:, None] + x1 * s[:, None]], axis=-1)
    return out.reshape(len(positions), heads * HEAD_DIM)


def forward(W, tokens):
    """float64 Llama forward pass; W: name -> float64 [out, in] arrays."""
    def norm(x, w):
        return w * x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + EPS)

    T = len(tokens)
    pos = np.arange(T)
    x = W["model.embed_tokens.weight"][tokens]
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        h = norm(x, W[p + "input_layernorm.weight"])
        q = rope(h @ W[p + "self_attn.q_proj.weight"].T, HEADS, pos)
        k = rope(h @ W[p + "self_attn.k_proj.weight"].T, KV_HEADS, pos)
        v = h @ W[p + "self_attn.v_proj.weight"].T
        attn = np.zeros((T, HEADS * HEAD_DIM))
        for hd in range(HEADS):
            g = hd // (HEADS // KV_HEADS)
            qh = q[:, hd * HEAD_DIM:(hd + 1) * HEAD_DIM]
            kh = k[:, g * HEAD_DIM:(g + 1) * HEAD_DIM]
            vh = v[:, g * HEAD_DIM:(g + 1) * HEAD_DIM]
            sc = qh @ kh.T / np.sqrt(HEAD_DIM)
            sc = np.where(np.tril(np.ones((T, T))) > 0, sc, -np.inf)
            sc = np.exp(sc - sc.max(axis=1, keepdims=True))
            sc /= sc.sum(axis=1, keepdims=True)
            attn[:, hd * HEAD_DIM:(hd + 1) * HEAD_DIM] = sc @ vh
        x = x + attn @ W[p + "self_attn.o_proj.weight"].T
        h = norm(x, W[p + "post_attention_layernorm.weight"])
        gate = h @ W[p + "mlp.gate_proj.weight"].T
        up = h @ W[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ W[p + "mlp.down_proj.weight"].T
    return norm(x, W["model.norm.weight"]) @ W["lm_head.weight"].T


def main():
    out_dir, kind = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(zlib.crc32(kind.encode()))
    method = "awq" if kind.startswith("awq") else "gptq"
    bits = 8 if "8" in kind.split("-")[0] else 4
    if kind == "bad-3bit":
        bits = 3
    group = -1 if kind.endswith("-pc") else 32
    for part in kind.split("-"):  # "-g128": groups of 128 input rows
        if part.startswith("g") and part[1:].isdigit():
            group = int(part[1:])
    sym = method == "gptq" and "asym" not in kind
    act_order = "actorder" in kind
    v2 = kind.endswith("-v2")
    qconf = {"quant_method": method, "bits": bits, "group_size": group}
    if method == "gptq":
        qconf.update({"desc_act": act_order, "sym": sym})
        if v2:
            qconf["checkpoint_format"] = "gptq_v2"
    else:
        qconf.update({"version": "gemm", "zero_point": True})
    sidefile = kind.endswith("-sidefile")
    if sidefile and method == "gptq":
        side_name = "quantize_config.json"
        side = {"bits": bits, "group_size": group, "damp_percent": 0.01,
                "desc_act": act_order, "static_groups": False, "sym": sym,
                "true_sequential": True, "model_name_or_path": None,
                "model_file_base_name": "model"}
    elif sidefile:
        side_name = "quant_config.json"
        side = {"zero_point": True, "q_group_size": group, "w_bit": bits,
                "version": "GEMM"}
    config = {
        "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTER, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "vocab_size": VOCAB, "max_position_embeddings": 128,
        "rms_norm_eps": EPS, "rope_theta": THETA, "hidden_act": "silu",
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
        "quantization_config": qconf,
    }
    if sidefile or kind == "bad-no-quant-config":
        del config["quantization_config"]
    if sidefile:
        with open(os.path.join(out_dir, side_name), "w") as f:
            json.dump(side, f, indent=2)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    tensors, expected, W = {}, {}, {}

    def dense(name, shape, scale, offset=0.0):
        w = (offset + scale * rng.uniform(-1, 1, shape)).astype(np.float32)
        tensors[name] = ("F32", w)
        W[name] = w.astype(np.float64)

    dense("model.embed_tokens.weight", (VOCAB, HIDDEN), 1.0)
    dense("model.norm.weight", (HIDDEN,), 0.2, 1.0)
    dense("lm_head.weight", (VOCAB, HIDDEN), 1.0)
    Q, KV = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        dense(p + "input_layernorm.weight", (HIDDEN,), 0.2, 1.0)
        dense(p + "post_attention_layernorm.weight", (HIDDEN,), 0.2, 1.0)
        act_perm = rng.permutation(HIDDEN)  # shared by q/k/v (same inputs)
        for name, out_f, in_f in [("self_attn.q_proj", Q, HIDDEN),
                                  ("self_attn.k_proj", KV, HIDDEN),
                                  ("self_attn.v_proj", KV, HIDDEN),
                                  ("self_attn.o_proj", HIDDEN, Q),
                                  ("mlp.gate_proj", INTER, HIDDEN),
                                  ("mlp.up_proj", INTER, HIDDEN),
                                  ("mlp.down_proj", HIDDEN, INTER)]:
            prefix = p + name
            w = rng.uniform(-1, 1, (out_f, in_f)) * 1.5 / np.sqrt(in_f)
            g = in_f if group == -1 else group
            if act_order:
                perm = act_perm if in_f == HIDDEN else rng.permutation(in_f)
                g_idx = np.zeros(in_f, np.int64)
                g_idx[perm] = np.arange(in_f) // g
            else:
                g_idx = np.arange(in_f) // g
            qbits = 4 if bits == 3 else bits
            codes, scales, zeros = quantize(w, qbits, g, sym, g_idx, rng)
            W[prefix + ".weight"] = scales.astype(np.float64)[g_idx].T * (
                codes - zeros[g_idx].T)
            if method == "gptq":
                qweight = pack_words(codes.T, bits if bits != 3 else 4, 0)
                stored = (zeros - (0 if v2 else 1)) & ((1 << qbits) - 1)
                qzeros = pack_words(stored, qbits, 1)
            else:
                qweight = pack_words(codes.T, 4, 1, AWQ_ORDER)
                qzeros = pack_words(zeros, 4, 1, AWQ_ORDER)
            if kind == "bad-shape" and name == "mlp.up_proj" and l == 1:
                qweight = qweight[:-1]
            tensors[prefix + ".qweight"] = ("I32", qweight)
            tensors[prefix + ".qzeros"] = ("I32", qzeros)
            if not (kind == "bad-no-scales" and name == "self_attn.o_proj"):
                tensors[prefix + ".scales"] = ("F16", scales)
            if method == "gptq" and kind != "bad-actorder-no-gidx":
                tensors[prefix + ".g_idx"] = ("I32", g_idx.astype(np.int32))
            expected[prefix + ".codes"] = ("I32", codes.astype(np.int32))
            expected[prefix + ".scales"] = ("F32", scales.astype(np.float32))
            expected[prefix + ".zeros"] = ("I32", zeros.astype(np.int32))
            expected[prefix + ".g_idx"] = ("I32", g_idx.astype(np.int32))
    if kind == "bad-actorder-no-gidx":
        config["quantization_config"]["desc_act"] = True
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    tokens = rng.integers(0, VOCAB, 12)
    expected["tokens"] = ("I32", tokens.astype(np.int32))
    expected["logits"] = ("F32", forward(W, tokens).astype(np.float32))
    write_safetensors(os.path.join(out_dir, "expected.safetensors"), expected)


if __name__ == "__main__":
    main()
