#!/usr/bin/env python3
"""Build Bulkhead's quickstart model, `bulkhead-demo-tiny`, from nothing.

Stages, all run by default (see README.md next to this file):

  data       extract Jane Austen's six novels from the Debian package
             r-cran-janeaustenr (downloaded with `apt-get download`, unpacked
             with `dpkg-deb -x`; R itself is not needed), rejoin lines into
             paragraphs and hold out the last 2% of every novel;
  tokenizer  train a byte-level BPE (Llama 3 split regex) with HF `tokenizers`;
  train      train a small LlamaForCausalLM with PyTorch on the CPU, fixed seeds,
             plus a little synthetic chat data rendered with the chat template;
  export     write an F32 GGUF with the `gguf` package (llama.cpp's layout for
             arch `llama`, q/k rows permuted for its interleaved RoPE), then
             quantize it to Q8_0 with llama.cpp (llama-cpp-python);
  reference  record the fixture the Rust test checks: llama.cpp's prompt
             tokens and 32 greedy tokens, and HF tokenizer ids for some strings.

Outputs: models/bulkhead-demo-tiny/bulkhead-demo-tiny-q8_0.gguf, models/bulkhead-demo-tiny.reference.json;
intermediate files go to tools/demo-model/build/ (not committed).
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BUILD = HERE / "build"
MODELS = REPO / "models"
NAME = "bulkhead-demo-tiny"
# The model folder is signed as a whole: re-sign it with tools/demo-model/sign.
Q8_PATH = MODELS / NAME / f"{NAME}-q8_0.gguf"
REF_PATH = MODELS / f"{NAME}.reference.json"

SEED = 1234
THREADS = 2

# --- data -----------------------------------------------------------------
DEB_PACKAGE = "r-cran-janeaustenr"
RDATA = "usr/lib/R/site-library/janeaustenr/data/Rdata"  # .rdb / .rdx inside the package
HELDOUT_FRACTION = 0.02

# --- tokenizer ------------------------------------------------------------
VOCAB_SIZE = 4096
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
# Llama 3's pre-tokenizer split (as in its tokenizer.json).
SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# --- model and training ----------------------------------------------------
MODEL = dict(
    hidden_size=256,
    intermediate_size=768,  # multiple of 256 so every K-quant block fits
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)
SEQ_LEN = 512
BATCH = 12
LR = 3e-3
WARMUP = 40
WEIGHT_DECAY = 0.1
CHAT_FRACTION = 0.15  # share of batch rows drawn from the synthetic chats


def log(msg: str):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ==========================================================================
# data
# ==========================================================================
class RUnserializer:
    """Just enough of R's XDR serialization format to read the package's data:
    pairlists, logical/integer/double/character vectors and lists with names."""

    def __init__(self, data: bytes):
        self.b, self.i, self.refs = data, 0, []

    def _int(self) -> int:
        (v,) = struct.unpack_from(">i", self.b, self.i)
        self.i += 4
        return v

    def read(self):
        if self.b[:2] != b"X\n":
            raise ValueError("not an R XDR stream")
        self.i = 2
        version = self._int()
        self._int(), self._int()  # writer and minimal reader versions
        if version == 3:
            n = self._int()  # native encoding name
            self.i += n
        return self._item()

    def _item(self):
        flags = self._int()
        kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind in (254, 253, 242, 241, 247, 251, 252):  # NULL, environments, markers
            return None
        if kind == 255:  # reference to an earlier symbol
            return self.refs[(flags >> 8) - 1]
        if kind == 1:  # symbol
            s = self._item()
            self.refs.append(s)
            return s
        if kind == 9:  # CHARSXP
            n = self._int()
            if n < 0:
                return None
            s = self.b[self.i : self.i + n].decode("utf-8")
            self.i += n
            return s
        if kind in (2, 6, 17):  # pairlist, call, dots: [(tag, value), ...]
            if has_attr:
                self._item()
            tag = self._item() if has_tag else None
            car, cdr = self._item(), self._item()
            return [(tag, car)] + (cdr if isinstance(cdr, list) else [])
        n = self._int()
        if kind in (10, 13):
            v = list(struct.unpack_from(f">{n}i", self.b, self.i))
            self.i += 4 * n
        elif kind == 14:
            v = list(struct.unpack_from(f">{n}d", self.b, self.i))
            self.i += 8 * n
        elif kind in (16, 19):
            v = [self._item() for _ in range(n)]
        else:
            raise ValueError(f"unsupported R type {kind}")
        if has_attr:
            attrs = dict(self._item())
            if "names" in attrs:
                return dict(zip(attrs["names"], v))
        return v


def fetch_package() -> tuple[Path, str]:
    """Download and unpack the Debian package (no R installation needed)."""
    root = BUILD / "deb"
    if not (root / (RDATA + ".rdb")).exists():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", DEB_PACKAGE], cwd=BUILD, check=True)
        deb = sorted(BUILD.glob(f"{DEB_PACKAGE}_*.deb"))[-1]
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    deb = sorted(BUILD.glob(f"{DEB_PACKAGE}_*.deb"))[-1]
    version = deb.name.split("_")[1]
    return root, version


def load_novels(root: Path) -> dict[str, list[str]]:
    index = RUnserializer(gzip.open(root / (RDATA + ".rdx")).read()).read()
    rdb = (root / (RDATA + ".rdb")).read_bytes()
    novels = {}
    for name, (off, length) in index["variables"].items():
        blob = rdb[int(off) : int(off) + int(length)]
        # 4-byte uncompressed length, then a zlib stream
        novels[name] = RUnserializer(zlib.decompress(blob[4:])).read()
    return novels


def paragraphs(lines: list[str]) -> list[str]:
    """Rejoin the printed lines of a novel into paragraphs; drop the Gutenberg
    underscores that mark italics."""
    out, cur = [], []
    for line in lines + [""]:
        line = (line or "").strip()
        if line:
            cur.append(line)
        elif cur:
            p = re.sub(r"\s+", " ", " ".join(cur)).replace("_", "")
            out.append(p)
            cur = []
    return out


def prepare_data():
    root, version = fetch_package()
    novels = load_novels(root)
    train, heldout = {}, {}
    for name, lines in novels.items():
        paras = paragraphs(lines)
        total = sum(len(p) for p in paras)
        cut, acc = len(paras), 0
        while acc < HELDOUT_FRACTION * total:
            cut -= 1
            acc += len(paras[cut])
        train[name], heldout[name] = paras[:cut], paras[cut:]
    info = {
        "package": DEB_PACKAGE,
        "version": version,
        "files": [RDATA + ".rdb", RDATA + ".rdx"],
        "novels": {
            n: {
                "paragraphs_train": len(train[n]),
                "paragraphs_heldout": len(heldout[n]),
                "chars_train": sum(len(p) + 2 for p in train[n]),
                "chars_heldout": sum(len(p) + 2 for p in heldout[n]),
            }
            for n in novels
        },
    }
    log(f"data: {DEB_PACKAGE} {version}: " + ", ".join(f"{n} {len(v)} paragraphs" for n, v in train.items()))
    return train, heldout, info


# ==========================================================================
# synthetic chats
# ==========================================================================
SENTENCE_END = re.compile(r'(?<=[.!?])"?\s+(?=["A-Z])')


def pure_speech(p: str) -> str | None:
    """A paragraph that is one quoted speech and nothing else, without its quotes."""
    if len(p) < 20 or len(p) > 600 or not (p.startswith('"') and p.endswith('"')) or p.count('"') != 2:
        return None
    return p[1:-1].strip()


def make_chats(train: dict[str, list[str]], rng: random.Random) -> list[list[dict]]:
    """Two honest kinds of chat, both cut straight from the training text:
    an exchange of two consecutive speeches (user says the first, the
    assistant answers with the second), and "continue this passage"."""
    chats = []
    for paras in train.values():
        for a, b in zip(paras, paras[1:]):
            sa, sb = pure_speech(a), pure_speech(b)
            if sa and sb:
                chats.append([{"role": "user", "content": sa}, {"role": "assistant", "content": sb}])
        for p in paras:
            sents = SENTENCE_END.split(p)
            if len(sents) >= 3 and len(p) < 1500 and rng.random() < 0.35:
                k = rng.randint(1, 2)
                head, tail = " ".join(sents[:k]), " ".join(sents[k:])
                ask = rng.choice(["Continue this passage:", "Continue the story:", "What comes next?"])
                chats.append([
                    {"role": "user", "content": f"{ask}\n\n{head}"},
                    {"role": "assistant", "content": tail},
                ])
    rng.shuffle(chats)
    return chats


def render_chat(messages: list[dict], add_generation_prompt: bool = False) -> str:
    from jinja2 import Environment

    return Environment().from_string(CHAT_TEMPLATE).render(
        messages=messages, bos_token=BOS, add_generation_prompt=add_generation_prompt
    )


# ==========================================================================
# tokenizer
# ==========================================================================
def train_tokenizer(train: dict[str, list[str]]):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tk.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIALS),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tk.train_from_iterator((p + "\n\n" for paras in train.values() for p in paras), trainer=trainer)
    # control tokens after the learned vocabulary, as in Llama 3
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    bos_id = tk.token_to_id(BOS)
    tk.post_processor = processors.TemplateProcessing(single=f"{BOS}:0 $A:0", special_tokens=[(BOS, bos_id)])
    assert tk.get_vocab_size() == VOCAB_SIZE, tk.get_vocab_size()
    tk.save(str(BUILD / "tokenizer.json"))
    log(f"tokenizer: {tk.get_vocab_size()} tokens")
    return tk


# ==========================================================================
# training
# ==========================================================================
def encode_corpus(tk, train, chats):
    """Token ids of every novel (paragraphs joined by blank lines) with the
    offsets where paragraphs start, and the rendered chats with their starts."""
    import numpy as np

    ids, starts = [], []
    for paras in train.values():
        text = "\n\n".join(paras) + "\n\n"
        enc = tk.encode(text, add_special_tokens=False)
        base = len(ids)
        ids.extend(enc.ids)
        # a paragraph starts at the token whose offset follows a blank line
        para_offsets, pos = set(), 0
        for p in paras:
            para_offsets.add(pos)
            pos += len(p) + 2
        starts.extend(base + i for i, (s, _) in enumerate(enc.offsets) if s in para_offsets)
        ids.append(tk.token_to_id(EOS))
    chat_ids, chat_starts = [], []
    for c in chats:
        chat_starts.append(len(chat_ids))
        chat_ids.extend(tk.encode(render_chat(c), add_special_tokens=False).ids)
    return (np.array(ids, dtype=np.int64), np.array(starts, dtype=np.int64),
            np.array(chat_ids, dtype=np.int64), np.array(chat_starts, dtype=np.int64))


def build_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB_SIZE, bos_token_id=0, eos_token_id=0, attention_bias=False,
                      mlp_bias=False, hidden_act="silu", initializer_range=0.02, **MODEL)
    return LlamaForCausalLM(cfg)


def heldout_eval(model, tk, heldout, bos_id):
    """Held-out perplexity per token and bits per byte: every novel's held-out
    paragraphs, cut into windows of SEQ_LEN-1 tokens, each after BOS."""
    import torch

    model.eval()
    nll, ntok, nbytes = 0.0, 0, 0
    with torch.no_grad():
        for paras in heldout.values():
            text = "\n\n".join(paras) + "\n\n"
            nbytes += len(text.encode("utf-8"))
            ids = tk.encode(text, add_special_tokens=False).ids
            for i in range(0, len(ids), SEQ_LEN - 1):
                chunk = [bos_id] + ids[i : i + SEQ_LEN - 1]
                x = torch.tensor([chunk])
                logits = model(x).logits[0, :-1].float()
                nll += torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").item()
                ntok += len(chunk) - 1
    model.train()
    return {"tokens": ntok, "bytes": nbytes, "ppl": math.exp(nll / ntok), "bits_per_byte": nll / math.log(2) / nbytes}


def train_model(tk, train, heldout, chats, steps: int, max_minutes: float):
    import numpy as np
    import torch

    torch.manual_seed(SEED)
    np.random.seed(SEED)
    torch.set_num_threads(THREADS)
    ids, starts, chat_ids, chat_starts = encode_corpus(tk, train, chats)
    bos_id = tk.token_to_id(BOS)
    log(f"train tokens: text {len(ids)}, chats {len(chat_ids)} ({len(chats)} chats)")
    starts = starts[starts + SEQ_LEN <= len(ids)]
    chat_starts = chat_starts[chat_starts + SEQ_LEN + 1 <= len(chat_ids)]

    model = build_model()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params:,} parameters")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.95))

    budget_s = max_minutes * 60

    def lr_at(step, elapsed):
        """Linear warmup, then cosine decay to 10% over the run; the run's
        progress is steps done or wall time spent, whichever is further, so
        the decay completes even where the time cap ends the run first."""
        if step < WARMUP:
            return LR * (step + 1) / WARMUP
        t = min(1.0, max((step - WARMUP) / max(1, steps - WARMUP), elapsed / budget_s))
        return LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    gen = np.random.default_rng(SEED)
    n_chat_rows = round(BATCH * CHAT_FRACTION)
    t0 = time.time()
    done = 0
    for step in range(steps):
        rows = []
        # text rows: BOS, then SEQ_LEN tokens starting at a paragraph
        for s in gen.choice(starts, BATCH - n_chat_rows):
            rows.append(np.concatenate([[bos_id], ids[s : s + SEQ_LEN]]))
        # chat rows start at a chat (whose template begins with BOS)
        for s in gen.choice(chat_starts, n_chat_rows):
            rows.append(chat_ids[s : s + SEQ_LEN + 1])
        batch = torch.from_numpy(np.stack(rows))
        lr = lr_at(step, time.time() - t0)
        for g in opt.param_groups:
            g["lr"] = lr
        out = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, VOCAB_SIZE).float(), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = step + 1
        elapsed = time.time() - t0
        if step % 25 == 0 or done == steps:
            rate = done * BATCH * SEQ_LEN / elapsed
            log(f"step {done}/{steps} loss {loss.item():.3f} lr {lr:.2e} {elapsed/60:.1f} min {rate:.0f} tok/s")
        if elapsed > budget_s:
            log(f"stopping at step {done}: the {max_minutes} minute budget is spent")
            break
    train_minutes = (time.time() - t0) / 60
    ev = heldout_eval(model, tk, heldout, bos_id)
    log(f"held-out: {ev}")
    stats = {"parameters": n_params, "steps": done, "planned_steps": steps, "batch": BATCH, "seq_len": SEQ_LEN,
             "train_minutes": round(train_minutes, 1), "tokens_seen": done * BATCH * SEQ_LEN,
             "final_loss": round(loss.item(), 4), "heldout": ev,
             "text_tokens": int(len(ids)), "chat_tokens": int(len(chat_ids)), "chats": len(chats),
             "torch": torch.__version__, "threads": THREADS}
    torch.save(model.state_dict(), BUILD / "model.pt")
    (BUILD / "train_stats.json").write_text(json.dumps(stats, indent=2))
    return model, stats


# ==========================================================================
# GGUF export and quantization
# ==========================================================================
def permute_rope(w, n_head: int):
    """HF keeps q/k rotary halves apart; llama.cpp's `llama` RoPE rotates
    adjacent pairs. Reorder the rows of each head accordingly."""
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def gguf_vocab(tk):
    vocab = tk.get_vocab()
    by_id = {i: t for t, i in vocab.items()}
    tokens = [by_id[i] for i in range(len(by_id))]
    types = [3 if t in SPECIALS else 1 for t in tokens]  # 3 = control, 1 = normal
    merges = json.loads(tk.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    return tokens, types, merges


def export_gguf(tk, state, path: Path):
    import gguf
    import numpy as np

    h, n_layers = MODEL["hidden_size"], MODEL["num_hidden_layers"]
    n_head, n_kv = MODEL["num_attention_heads"], MODEL["num_key_value_heads"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(NAME)
    w.add_context_length(SEQ_LEN)
    w.add_embedding_length(h)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(MODEL["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(MODEL["rms_norm_eps"])
    w.add_rope_freq_base(MODEL["rope_theta"])
    w.add_rope_dimension_count(h // n_head)
    w.add_vocab_size(VOCAB_SIZE)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    tokens, types, merges = gguf_vocab(tk)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tk.token_to_id(BOS))
    w.add_eos_token_id(tk.token_to_id(EOS))
    w.add_eot_token_id(tk.token_to_id("<|eot_id|>"))
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    def t(name):
        return state[name].float().numpy().astype(np.float32)

    emb = t("model.embed_tokens.weight")
    w.add_tensor("token_embd.weight", emb)
    for i in range(n_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", t(p + "input_layernorm.weight"))
        w.add_tensor(f"blk.{i}.attn_q.weight", permute_rope(t(p + "self_attn.q_proj.weight"), n_head))
        w.add_tensor(f"blk.{i}.attn_k.weight", permute_rope(t(p + "self_attn.k_proj.weight"), n_kv))
        w.add_tensor(f"blk.{i}.attn_v.weight", t(p + "self_attn.v_proj.weight"))
        w.add_tensor(f"blk.{i}.attn_output.weight", t(p + "self_attn.o_proj.weight"))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", t(p + "post_attention_layernorm.weight"))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", t(p + "mlp.gate_proj.weight"))
        w.add_tensor(f"blk.{i}.ffn_up.weight", t(p + "mlp.up_proj.weight"))
        w.add_tensor(f"blk.{i}.ffn_down.weight", t(p + "mlp.down_proj.weight"))
    w.add_tensor("output_norm.weight", t("model.norm.weight"))
    # tied embeddings: written out explicitly so every loader finds an output matrix
    w.add_tensor("output.weight", t("lm_head.weight") if "lm_head.weight" in state else emb)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    log(f"wrote {path} ({path.stat().st_size/1e6:.1f} MB)")


def quantize_q8_0(src: Path, dst: Path):
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    params.nthread = THREADS
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed: {rc}")
    log(f"wrote {dst} ({dst.stat().st_size/1e6:.1f} MB)")


# ==========================================================================
# reference fixture
# ==========================================================================
REF_PROMPT = "It is a truth universally acknowledged, that"
TOKENIZER_CASES = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
    '"My dear Mr. Bennet," said his lady to him one day, "have you heard that Netherfield Park is let at last?"',
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition,",
    "Hello, world! It's 2024; we'll see 12345 things they've done.",
    "  two leading spaces\nand a newline\n\n\tthen a tab   and trailing spaces   ",
    "Ünïcödé, naïve café — “curly quotes” and 日本語 and emoji 🦀!",
    "I'M SHOUTING, you're WHISPERING; DON'T.",
    "",
]


def make_reference(tk, q8: Path):
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(model_path=str(q8), n_ctx=SEQ_LEN, n_threads=THREADS, n_batch=SEQ_LEN,
                          logits_all=True, verbose=False, seed=SEED)
    prompt_tokens = llm.tokenize(REF_PROMPT.encode(), add_bos=True, special=False)
    hf_prompt = tk.encode(REF_PROMPT, add_special_tokens=True).ids
    assert prompt_tokens == hf_prompt, (prompt_tokens, hf_prompt)
    llm.reset()
    llm.eval(prompt_tokens)
    greedy = []
    for _ in range(32):
        logits = np.asarray(llm.scores[llm.n_tokens - 1])
        nxt = int(np.argmax(logits))
        greedy.append(nxt)
        llm.eval([nxt])
    cases = []
    for text in TOKENIZER_CASES:
        ids = tk.encode(text, add_special_tokens=False).ids
        lc = llm.tokenize(text.encode(), add_bos=False, special=False)
        assert ids == lc, f"llama.cpp tokenizes {text!r} differently: {ids} vs {lc}"
        assert tk.decode(ids, skip_special_tokens=False) == text
        cases.append({"text": text, "ids": ids})
    from importlib.metadata import version
    tools = {"python": sys.version.split()[0],
             **{p: version(p) for p in ("torch", "transformers", "tokenizers", "gguf",
                                        "llama-cpp-python", "numpy")}}
    ref = {"prompt": REF_PROMPT, "prompt_tokens": prompt_tokens, "greedy_llamacpp": greedy,
           "greedy_text": llm.detokenize(greedy).decode("utf-8", "replace"), "tokenizer_cases": cases,
           "tools": tools}
    REF_PATH.write_text(json.dumps(ref, indent=1, ensure_ascii=False) + "\n")
    log(f"wrote {REF_PATH}; greedy: {REF_PROMPT}{ref['greedy_text']!r}")


# ==========================================================================
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=330, help="optimizer steps (default %(default)s)")
    ap.add_argument("--max-minutes", type=float, default=28.0,
                    help="stop training early once this much wall time is spent (default %(default)s)")
    ap.add_argument("--skip-train", action="store_true", help="reuse build/model.pt from an earlier run")
    args = ap.parse_args()

    random.seed(SEED)
    BUILD.mkdir(parents=True, exist_ok=True)
    Q8_PATH.parent.mkdir(parents=True, exist_ok=True)
    import torch
    from tokenizers import Tokenizer

    torch.set_num_threads(THREADS)
    train, heldout, data_info = prepare_data()
    (BUILD / "data_info.json").write_text(json.dumps(data_info, indent=2))
    chats = make_chats(train, random.Random(SEED))
    (BUILD / "chats_sample.json").write_text(json.dumps(chats[:20], indent=1))
    if args.skip_train:
        tk = Tokenizer.from_file(str(BUILD / "tokenizer.json"))
        model = build_model()
        model.load_state_dict(torch.load(BUILD / "model.pt"))
    else:
        tk = train_tokenizer(train)
        model, _ = train_model(tk, train, heldout, chats, args.steps, args.max_minutes)
    f32 = BUILD / f"{NAME}-f32.gguf"
    export_gguf(tk, model.state_dict(), f32)
    quantize_q8_0(f32, Q8_PATH)
    make_reference(tk, Q8_PATH)


if __name__ == "__main__":
    main()
