"""Writes the decoder's golden payloads and what each must decode to.

Run from the repository root with Debian's python3-msgpack (1.0.3):

    /usr/bin/python3 kvevents/testdata/gen.py

Each payload is encoded by msgpack-python, not by the code under test, in
the layout vLLM's msgspec structs give (vllm/distributed/kv_events.py):
EventBatch is an array [ts, events, data_parallel_rank]; each event is a
tagged array ["BlockStored", field, ...] in the releases before vLLM's map
encoding (PR 42892) and a map with a "type" key after it. The fields come
in declaration order, each release appending its own. The expected values
(NAME.json) are written from the same Python values, so the Go test checks
the decoder against what was encoded, not against itself.
"""

import json
import pathlib

import msgpack

HERE = pathlib.Path(__file__).parent
TS = 1789095808.8378847

# Sixteen tokens of a Qwen3 chat header: fixints, uint8, uint16, uint32.
FIRST = [151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198, 151644, 77091, 198, 151667]
SECOND = list(range(100, 116))
# vLLM's default: the low 64 bits of the digest as an unsigned int; the
# second needs msgpack's uint64.
H1 = 15760518052499183552
H2 = 0xFFFFFFFFFFFFFFFF
H3 = 7


def stored_map(hashes, parent, tokens, **extra):
    ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
          "token_ids": tokens, "block_size": 16, "lora_id": None, "medium": "GPU",
          "lora_name": None, "extra_keys": [None] * len(hashes), "group_idx": 0,
          "kv_cache_spec_kind": "full_attention"}
    ev.update(extra)
    return ev


def removed_map(hashes, **extra):
    ev = {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", "group_idx": 0}
    ev.update(extra)
    return ev


CLEARED_MAP = {"type": "AllBlocksCleared"}

CASES = {
    # vLLM after the map encoding (0.26 as captured from a running engine).
    "map": [TS, [stored_map([H1, H2], None, FIRST + SECOND), stored_map([H3], H2, SECOND),
                 removed_map([H1]), CLEARED_MAP], 0],
    # Fields of later releases, and an event type this decoder does not
    # know: both skipped.
    "map_unknown": [TS, [stored_map([H3], None, SECOND, cache_salt="tenant-a", session_id="s1",
                                    locality={"node": "a", "rank": [1, 2]}),
                         {"type": "BlockTouched", "block_hashes": [H3]},
                         removed_map([H3], locality="local")], 0],
    # An adapter's blocks on the CPU offload tier.
    "map_lora_cpu": [TS, [stored_map([H3], None, SECOND, lora_id=3, lora_name="adapter", medium="CPU")], 1],
    # The first release (0.9): no medium, no rank in the batch.
    "array_v09": [TS, [["BlockStored", [H1, H2], None, FIRST + SECOND, 16, None],
                       ["BlockStored", [H3], H2, SECOND, 16, None],
                       ["BlockRemoved", [H1]], ["AllBlocksCleared"]]],
    # medium and data_parallel_rank (0.10).
    "array_v010": [TS, [["BlockStored", [H1], None, FIRST, 16, None, "GPU"],
                        ["BlockRemoved", [H1], "GPU"], ["AllBlocksCleared"]], 0],
    # extra_keys (vllm#33304): a salted prompt's first block carries the
    # cache salt, as generate_block_hash_extra_keys makes it for the block
    # at token 0 (a tuple: the adapter's name, multimodal keys, the salt);
    # its extension carries none. The last event's tuple has every kind of
    # value, to check that each is kept.
    "map_salt": [TS, [stored_map([H1, H2], None, FIRST + SECOND, extra_keys=[["0123456789abcdef"], None]),
                      stored_map([H3], H2, SECOND, extra_keys=[None]),
                      stored_map([H1], None, FIRST, lora_id=3, lora_name="adapter",
                                 extra_keys=[["adapter", "a salt longer than thirty-one bytes, as str8"]]),
                      stored_map([H2], None, SECOND,
                                 extra_keys=[[["image-uuid", 0], -1, 2**64 - 1, 300, 1.5, True, b"\x00\x01"]])], 0],
    # lora_name, extra_keys, group_idx; sha256 digests as bytes
    # (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) and a signed int hash.
    "array_bytes": [TS, [["BlockStored", [bytes(range(32)), -2], bytes(range(100, 132)), FIRST + SECOND, 16,
                          None, "GPU", None, [["salt-1"], None], 0],
                         ["BlockRemoved", [bytes(range(32))], "GPU", 0]], None],
}


def render_hash(h):
    if isinstance(h, bytes):
        return "b:" + h.hex()
    return "i:%016x" % (h & 0xFFFFFFFFFFFFFFFF)


def render_extra(v):
    """Extra keys in JSON: bytes as {"bytes": HEX}, the rest as they are."""
    if isinstance(v, bytes):
        return {"bytes": v.hex()}
    if isinstance(v, (list, tuple)):
        return [render_extra(x) for x in v]
    return v


def expected(batch):
    ts, events = batch[0], batch[1]
    rank = batch[2] if len(batch) > 2 and batch[2] is not None else -1
    out = []
    for ev in events:
        if isinstance(ev, list):
            names = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                                     "medium", "lora_name", "extra_keys", "group_idx"],
                     "BlockRemoved": ["block_hashes", "medium", "group_idx"],
                     "AllBlocksCleared": []}[ev[0]]
            f = dict(zip(names, ev[1:]))
            f["type"] = ev[0]
        else:
            f = ev
        if f["type"] not in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
            continue
        lora = f.get("lora_name") or ("" if f.get("lora_id") is None else str(f["lora_id"]))
        parent = f.get("parent_block_hash")
        out.append({"kind": f["type"], "hashes": [render_hash(h) for h in f.get("block_hashes", [])],
                    "parent": "" if parent is None else render_hash(parent), "tokens": f.get("token_ids", []),
                    "block_size": f.get("block_size", 0), "medium": f.get("medium") or "", "lora": lora,
                    "group": f.get("group_idx") or 0, "extra_keys": render_extra(f.get("extra_keys"))})
    return {"ts": ts, "rank": rank, "events": out}


def main():
    for name, batch in CASES.items():
        (HERE / (name + ".msgpack")).write_bytes(msgpack.packb(batch, use_bin_type=True))
        (HERE / (name + ".json")).write_text(json.dumps(expected(batch), indent=1) + "\n")
        print("wrote", name)


if __name__ == "__main__":
    main()
