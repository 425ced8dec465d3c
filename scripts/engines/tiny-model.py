#!/usr/bin/python3
"""Writes a tiny random-weight GGUF model with the real Llama-3.1 vocabulary.

Usage: tiny-model.py GGUF_PY_DIR TOKENIZER_DIR OUT.gguf

The model is the qwen2 architecture (llama's blocks plus the QKV biases, and
an output bias that llama.cpp's llama architecture lacks): 4 layers, 256
wide, 8k context. Its output bias bans, with -1e4, every token whose bytes
are not valid UTF-8 on their own and every special token, so that a reply
never ends early or breaks the server's UTF-8 output and always runs to
max_tokens. The weights are seeded: the same inputs give the same file.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, sys.argv[1])
import gguf  # noqa: E402  (from llama.cpp's own tree)

tok_dir, out = sys.argv[2], sys.argv[3]
with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
    tok = json.load(f)
with open(os.path.join(tok_dir, "tokenizer_config.json"), encoding="utf-8") as f:
    tok_cfg = json.load(f)

vocab = tok["model"]["vocab"]
added = {t["id"]: t for t in tok["added_tokens"]}
n_vocab = max(max(vocab.values()), max(added)) + 1
tokens = [""] * n_vocab
types = [gguf.TokenType.NORMAL] * n_vocab
for s, i in vocab.items():
    tokens[i] = s
for i, t in added.items():
    tokens[i] = t["content"]
    types[i] = gguf.TokenType.CONTROL if t["special"] else gguf.TokenType.USER_DEFINED
merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]

# GPT-2's byte-level alphabet: printable bytes stand for themselves, the
# others are shifted to 256 and up.
printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
byte_of = {}
n = 0
for b in range(256):
    if b in printable:
        byte_of[chr(b)] = b
    else:
        byte_of[chr(256 + n)] = b
        n += 1


def standalone_utf8(s):
    try:
        bytes(byte_of[c] for c in s).decode("utf-8")
        return True
    except (KeyError, UnicodeDecodeError):
        return False


bias = np.zeros(n_vocab, dtype=np.float32)
banned = 0
for i in range(n_vocab):
    if types[i] != gguf.TokenType.NORMAL or not standalone_utf8(tokens[i]):
        bias[i] = -1e4
        banned += 1

n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx = 256, 4, 4, 2, 512, 8192
head = n_embd // n_head
rng = np.random.default_rng(7)


def w(*shape, dtype=np.float16):
    return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(dtype)


g = gguf.GGUFWriter(out, "qwen2")
g.add_name("kvload-tiny-llama3-vocab")
g.add_context_length(n_ctx)
g.add_embedding_length(n_embd)
g.add_block_count(n_layer)
g.add_feed_forward_length(n_ff)
g.add_head_count(n_head)
g.add_head_count_kv(n_head_kv)
g.add_layer_norm_rms_eps(1e-6)
g.add_rope_freq_base(500000.0)
g.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
g.add_tokenizer_model("gpt2")
g.add_tokenizer_pre("llama-bpe")
g.add_token_list(tokens)
g.add_token_types(types)
g.add_token_merges(merges)
special_id = {t["content"]: i for i, t in added.items()}
g.add_bos_token_id(special_id[tok_cfg["bos_token"]])
g.add_eos_token_id(special_id[tok_cfg["eos_token"]])
g.add_add_bos_token(True)
g.add_chat_template(tok_cfg["chat_template"])

g.add_tensor("token_embd.weight", w(n_vocab, n_embd))
g.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
g.add_tensor("output.bias", bias)
for i in range(n_layer):
    p = f"blk.{i}."
    g.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
    g.add_tensor(p + "attn_q.weight", w(n_embd, n_embd))
    g.add_tensor(p + "attn_q.bias", np.zeros(n_embd, dtype=np.float32))
    g.add_tensor(p + "attn_k.weight", w(n_head_kv * head, n_embd))
    g.add_tensor(p + "attn_k.bias", np.zeros(n_head_kv * head, dtype=np.float32))
    g.add_tensor(p + "attn_v.weight", w(n_head_kv * head, n_embd))
    g.add_tensor(p + "attn_v.bias", np.zeros(n_head_kv * head, dtype=np.float32))
    g.add_tensor(p + "attn_output.weight", w(n_embd, n_embd))
    g.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
    g.add_tensor(p + "ffn_gate.weight", w(n_ff, n_embd))
    g.add_tensor(p + "ffn_up.weight", w(n_ff, n_embd))
    g.add_tensor(p + "ffn_down.weight", w(n_embd, n_ff))

g.write_header_to_file()
g.write_kv_data_to_file()
g.write_tensors_to_file()
g.close()
print(f"{out}: {n_vocab} tokens, {banned} banned by the output bias", file=sys.stderr)
