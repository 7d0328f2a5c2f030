#!/usr/bin/env python3
"""Makes a small random Llama model and a byte-level BPE tokenizer locally (no model hub).

Writes two forms of the same weights:
  <out>/hf/          config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
                     generation_config.json: what `vllm serve <out>/hf` loads
  <out>/model.gguf   the same model for llama.cpp (tokenizer embedded, pre-tokenizer gpt-2)

Needs numpy, tokenizers, safetensors and gguf only (no torch, no transformers), so the same
script serves both engines' virtual environments. Deterministic: the same arguments give the
same bytes, so captures made on two machines come from the same model.
"""

import argparse
import json
import os
import random

import numpy as np

WORDS = (
    "the of and to in is was for on that with as by at from his her are be this an which or "
    "had not but were have one their all can there been if more when will would who so no out "
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "token latency stream server request model prefill decode cache batch queue tensor kernel"
).split()
# Some multi-byte text so that the tokenizer has merges inside UTF-8 sequences and a random
# model emits incomplete characters (engines then hold text back: chunks with empty content).
EXTRA = "café naïve résumé 東京 데이터 Ωmega – “quoted” ✓ 🙂".split()

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]


SYLLABLES = "ka ri to mu sel van dor qui ple xa zon bre fit gul hov jem lun nax pyr tesh".split()


def word(rng):
    """Mostly English words; some made-up ones and numbers so the BPE fills its vocabulary."""
    r = rng.random()
    if r < 0.70:
        return rng.choice(WORDS)
    if r < 0.90:
        return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))
    if r < 0.95:
        return str(rng.randint(0, 99999))
    return rng.choice(EXTRA)


def corpus(seed, lines):
    rng = random.Random(seed)
    for _ in range(lines):
        n = rng.randint(5, 30)
        words = [word(rng) for _ in range(n)]
        yield " ".join(words).capitalize() + rng.choice([".", ".", "?", "!", ","])


def make_tokenizer(vocab_size, seed):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed, 20000), trainer=trainer)
    return tok


def make_weights(cfg, seed):
    """Random Llama weights, HF names and shapes ([out, in]), float32."""
    rng = np.random.default_rng(seed)
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = h // nh

    def mat(rows, cols, scale):
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(v, h, 1.0)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        s = 1.0 / np.sqrt(h)
        w[p + "self_attn.q_proj.weight"] = mat(nh * hd, h, s)
        w[p + "self_attn.k_proj.weight"] = mat(nkv * hd, h, s)
        w[p + "self_attn.v_proj.weight"] = mat(nkv * hd, h, s)
        w[p + "self_attn.o_proj.weight"] = mat(h, nh * hd, s)
        w[p + "mlp.gate_proj.weight"] = mat(inter, h, s)
        w[p + "mlp.up_proj.weight"] = mat(inter, h, s)
        w[p + "mlp.down_proj.weight"] = mat(h, inter, 1.0 / np.sqrt(inter))
        w[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
    w["model.norm.weight"] = np.ones(h, dtype=np.float32)
    # A larger output scale spreads the logits, so greedy decoding wanders instead of settling
    # on one token at once.
    w["lm_head.weight"] = mat(v, h, 4.0 / np.sqrt(h))
    return w


def write_hf(out, cfg, weights, tok):
    from safetensors.numpy import save_file

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}, f, indent=2)
    save_file(weights, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    tok.save(os.path.join(out, "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "pad_token": "<|pad|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": cfg["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=2)
    with open(os.path.join(out, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}, f)


def permute_for_rope(w, n_head):
    """HF stores q/k rows in rotate-half order; llama.cpp wants interleaved pairs."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def write_gguf(path, cfg, weights, tok, name):
    import gguf

    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(name)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(nh)
    writer.add_head_count_kv(nkv)
    writer.add_rope_dimension_count(cfg["hidden_size"] // nh)
    writer.add_rope_freq_base(cfg["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    tokens = [None] * cfg["vocab_size"]
    for t, i in vocab.items():
        tokens[i] = t
    for added in spec.get("added_tokens", []):
        tokens[added["id"]] = added["content"]
    special_ids = {a["id"] for a in spec.get("added_tokens", [])}
    for i, t in enumerate(tokens):
        if t is None:
            tokens[i] = f"<|unused_{i}|>"
            special_ids.add(i)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if i in special_ids else gguf.TokenType.NORMAL for i in range(len(tokens))]
    )
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        for hf, gg in names.items():
            w = weights[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                w = permute_for_rope(w, nh)
            elif gg == "attn_k":
                w = permute_for_rope(w, nkv)
            writer.add_tensor(f"blk.{i}.{gg}.weight", w)
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    writer.add_tensor("output.weight", weights["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--name", default="tiny-llama")
    args = ap.parse_args()

    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": args.hidden,
        "intermediate_size": args.hidden * 4,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.heads,
        "head_dim": args.hidden // args.heads,
        "vocab_size": args.vocab,
        "max_position_embeddings": args.max_len,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    tok = make_tokenizer(args.vocab, args.seed)
    actual = tok.get_vocab_size()
    if actual != args.vocab:
        raise SystemExit(f"tokenizer has {actual} entries, wanted {args.vocab}: grow the corpus")
    weights = make_weights(cfg, args.seed)
    write_hf(os.path.join(args.out, "hf"), cfg, weights, tok)
    write_gguf(os.path.join(args.out, "model.gguf"), cfg, weights, tok, args.name)
    params = sum(w.size for w in weights.values())
    print(json.dumps({"out": args.out, "parameters": int(params), "vocab": actual, "name": args.name}))


if __name__ == "__main__":
    main()
