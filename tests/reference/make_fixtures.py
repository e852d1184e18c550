#!/usr/bin/env python3
"""Generate Bulkhead's committed test fixtures (tokenizers, tiny random models,
reference logits, chat templates).

Run from the repository root:
    tests/reference/.venv/bin/python tests/reference/make_fixtures.py [--only tok,models,chat]

Everything is built from scratch with fixed seeds: tokenizers are trained on
Debian's /usr/share/common-licenses texts, models get random weights.  Nothing
is downloaded.  See tests/reference/README.md.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import math
import os
import random
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "2")

import numpy as np
try:
    import torch
except ModuleNotFoundError:  # literal_specials.py trains the tokenizers only
    torch = None
import gguf
from gguf import GGUFWriter, GGUFReader

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures"
TOK_DIR = FIX / "tokenizers"
MODEL_DIR = FIX / "models"
REF_DIR = FIX / "reference"
CHAT_DIR = FIX / "chat"
WORK = Path(tempfile.mkdtemp(prefix="bulkhead-fixtures-"))

CORPUS_SOURCE = "Debian /usr/share/common-licenses/* (license texts shipped with base-files), files sorted by name, symlinks skipped"

SEED = 1234

# --------------------------------------------------------------------------
# chat templates (common public forms of the two prompt formats)
# --------------------------------------------------------------------------
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
QWEN2_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Split regexes as they appear in the public tokenizer.json files.
GPT2_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def log(*a):
    print(*a, flush=True)


def corpus_text() -> str:
    parts = []
    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.islink(p) or not os.path.isfile(p):
            continue
        parts.append(Path(p).read_text(encoding="utf-8", errors="replace"))
    text = "\n".join(parts)
    assert len(text) > 100_000, "corpus too small; is /usr/share/common-licenses present?"
    return text


def corpus_lines() -> list[str]:
    return [l for l in corpus_text().split("\n")]


# --------------------------------------------------------------------------
# test strings
# --------------------------------------------------------------------------
def test_strings(kind: str) -> list[str]:
    s = [
        "",
        " ",
        "  ",
        "   leading spaces",
        "trailing spaces   ",
        "multiple    inner     spaces",
        "\t",
        "tab\tseparated\tvalues",
        "\n",
        "line one\nline two",
        "windows\r\nline\r\nendings",
        "para\n\n\nbreak",
        " \n \n\n \t\t \n",
        "Hello world",
        "Hello World!",
        "hello, world. How are you?",
        "The GNU General Public License is a free, copyleft license for software.",
        "caf\u00e9 na\u00efve r\u00e9sum\u00e9",            # precomposed
        "cafe\u0301 nai\u0308ve re\u0301sume\u0301",       # combining
        "\u00c5ngstr\u00f6m vs A\u030angstro\u0308m",
        "\U0001F600 \U0001F680 \u2705",
        "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 family",  # ZWJ sequence
        "\U0001F1E9\U0001F1EA\U0001F1EF\U0001F1F5 flags",  # DE JP flags
        "\U0001F44D\U0001F3FD skin tone",
        "\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e",
        "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
        "\u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438",
        "1",
        "12",
        "123",
        "1234",
        "12345",
        "123456",
        "1234567",
        "3.14159",
        "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3",
        "I'm sure you'LL see; don't worry, we've got it. I'D say 'RE fine",
        "fn main() {\n    let x: Vec<u8> = vec![1, 2, 3];\n    println!(\"{:?}\", x);\n}\n",
        "def f(a, b):\n\treturn a**2 + b // 3  # comment\n",
        "!!!???...,,,;;;:::---===+++***",
        "------======= '''''' ``````` \"\"\"\" ......!!!!!!??????",
        "a\u00a0non-breaking\u2009thin\u3000ideographic spaces",
        "mixed: caf\u00e9 \U0001F600 123 \u4e2d\u6587 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 <tag> x=1;",
        "\u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785\U0001F601",
        "\U0001F999\U0001F999 llamas",
        "zero\u200bwidth\u200dspace",
        "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
        "https://example.com/path?q=1&r=two#frag",
        "email: someone@example.org, phone +1-555-0100",
    ]
    specials = {
        "spm": ["<s>hello</s>", "text <s> in the middle", "<unk> and </s> tokens", "<s> <s>"],
        "gpt2": ["<|endoftext|>", "before<|endoftext|>after", "a <|endoftext|> b"],
        "llama3": [
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
            "plain <|eot_id|> inside",
            "<|end_of_text|>",
        ],
        "qwen2": [
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
            "<|im_start|>user",
            "text<|endoftext|>more",
        ],
    }
    return s + specials[kind]


# --------------------------------------------------------------------------
# tokenizer training
# --------------------------------------------------------------------------
SPM_VOCAB = 768
QWEN2_VOCAB = 768
BPE_VOCAB = 1024


def train_spm(outdir: Path) -> Path:
    import sentencepiece as spm

    outdir.mkdir(parents=True, exist_ok=True)
    txt = outdir / "corpus.txt"
    txt.write_text("\n".join(l for l in corpus_lines() if l.strip()), encoding="utf-8")
    prefix = str(outdir / "tokenizer")
    spm.SentencePieceTrainer.train(
        input=str(txt),
        model_prefix=prefix,
        model_type="bpe",
        vocab_size=SPM_VOCAB,
        character_coverage=1.0,
        byte_fallback=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        add_dummy_prefix=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1,
        shuffle_input_sentence=False,
        input_sentence_size=0,
        seed_sentencepiece_size=100000,
        max_sentence_length=100000,
        minloglevel=2,
    )
    return Path(prefix + ".model")


def hf_spm_tokenizer(model_file: Path, outdir: Path):
    """Load the trained SentencePiece model as HF LlamaTokenizerFast (legacy=True, i.e. the
    behaviour llama.cpp mirrors: a space prefix after every special token)."""
    from transformers import LlamaTokenizerFast

    src = outdir / "spm-src"
    src.mkdir(parents=True, exist_ok=True)
    shutil.copy(model_file, src / "tokenizer.model")
    tok = LlamaTokenizerFast.from_pretrained(str(src), legacy=True, add_bos_token=True, add_eos_token=False)
    tok.save_pretrained(str(outdir))
    return tok


def train_bytelevel(kind: str, outdir: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, normalizers, processors, Regex
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    outdir.mkdir(parents=True, exist_ok=True)
    tk = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    if kind == "gpt2":
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
        vocab = BPE_VOCAB
        specials = ["<|endoftext|>"]
    else:
        regex = LLAMA3_REGEX if kind == "llama3" else QWEN2_REGEX
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ])
        if kind == "llama3":
            vocab = BPE_VOCAB
            specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        else:
            tk.normalizer = normalizers.NFC()
            vocab = QWEN2_VOCAB
            specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tk.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False) if kind != "gpt2" else decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab - len(specials),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tk.train_from_iterator([l + "\n" for l in corpus_lines()], trainer=trainer)
    # special tokens appended after the learned vocab, as in the real models
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    ids = {s: tk.token_to_id(s) for s in specials}
    if kind == "llama3":
        bos = "<|begin_of_text|>"
        tk.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, ids[bos])])
        hf = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=bos, eos_token="<|eot_id|>",
                                     clean_up_tokenization_spaces=False)
        hf.chat_template = LLAMA3_TEMPLATE
        cfg = {"bos_token_id": ids[bos], "eos_token_id": ids["<|eot_id|>"]}
    elif kind == "qwen2":
        tk.post_processor = processors.ByteLevel(trim_offsets=False)
        hf = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=None, eos_token="<|im_end|>",
                                     pad_token="<|endoftext|>", unk_token=None,
                                     clean_up_tokenization_spaces=False)
        hf.chat_template = QWEN2_TEMPLATE
        cfg = {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"]}
    else:
        hf = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                     unk_token="<|endoftext|>", clean_up_tokenization_spaces=False)
        cfg = {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|endoftext|>"]}
    hf.save_pretrained(str(outdir))
    (outdir / "config.json").write_text(json.dumps(cfg))
    return hf


# --------------------------------------------------------------------------
# GGUF vocab writing (mirrors convert_hf_to_gguf.py: _create_vocab_sentencepiece,
# get_vocab_base + _set_vocab_gpt2, and gguf.SpecialVocab)
# --------------------------------------------------------------------------
def does_token_look_special(t: str) -> bool:
    # convert_hf_to_gguf.py TextModel.does_token_look_special
    seems = t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
    seems = seems or (t.startswith("<|") and t.endswith("|>"))
    seems = seems or (t.startswith("<\uff5c") and t.endswith("\uff5c>"))
    seems = seems or (t.startswith("<unused") and t.endswith(">"))
    return seems


def spm_vocab(tok_dir: Path, n_vocab: int):
    from sentencepiece import SentencePieceProcessor
    sp = SentencePieceProcessor()
    sp.LoadFromFile(str(tok_dir / "tokenizer.model"))
    T = gguf.TokenType
    tokens, scores, types = [], [], []
    assert sp.vocab_size() == n_vocab
    for i in range(sp.vocab_size()):
        tokens.append(sp.IdToPiece(i).encode("utf-8"))
        scores.append(sp.GetScore(i))
        if sp.IsUnknown(i):
            t = T.UNKNOWN
        elif sp.IsControl(i):
            t = T.CONTROL
        elif sp.IsUnused(i):
            t = T.UNUSED
        elif sp.IsByte(i):
            t = T.BYTE
        else:
            t = T.NORMAL
        types.append(int(t))
    return tokens, scores, types


def bpe_vocab(tok_dir: Path, hf):
    T = gguf.TokenType
    vocab = hf.get_vocab()
    n = max(vocab.values()) + 1
    rev = {i: t for t, i in vocab.items()}
    added = hf.get_added_vocab()
    dec = hf.added_tokens_decoder
    tokens, types = [], []
    for i in range(n):
        if i not in rev:
            tokens.append(f"[PAD{i}]"); types.append(int(T.UNUSED)); continue
        t = rev[i]
        if t in added:
            if dec[i].special or does_token_look_special(t):
                types.append(int(T.CONTROL))
            else:
                types.append(int(T.USER_DEFINED))
        else:
            types.append(int(T.NORMAL))
        tokens.append(t)
    return tokens, types


def write_tokenizer_kv(w: GGUFWriter, kind: str, tok_dir: Path, hf, chat_template: str | None):
    if kind == "spm":
        tokens, scores, types = spm_vocab(tok_dir, len(hf))
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        sv = gguf.SpecialVocab(tok_dir, n_vocab=len(tokens))
        sv.chat_template = None
        sv.add_to_gguf(w, quiet=True)
        w.add_add_space_prefix(True)
        n = len(tokens)
    else:
        tokens, types = bpe_vocab(tok_dir, hf)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre({"gpt2": "gpt-2", "llama3": "llama-bpe", "qwen2": "qwen2"}[kind])
        w.add_token_list(tokens)
        w.add_token_types(types)
        sv = gguf.SpecialVocab(tok_dir, load_merges=True)
        sv.chat_template = None
        sv.add_to_gguf(w, quiet=True)
        n = len(tokens)
    # HF's actual behaviour decides add_bos/add_eos (transformers 5 does not always
    # store add_bos_token in tokenizer_config.json, so SpecialVocab may not see it)
    with_sp = hf.encode("a", add_special_tokens=True)
    without = hf.encode("a", add_special_tokens=False)
    add_bos = len(with_sp) > len(without) and with_sp[0] == hf.bos_token_id
    add_eos = len(with_sp) > len(without) and with_sp[-1] == hf.eos_token_id
    if "bos" not in sv.add_special_token:
        w.add_add_bos_token(add_bos)
    if "eos" not in sv.add_special_token:
        w.add_add_eos_token(add_eos)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    return n


def write_vocab_only_gguf(path: Path, kind: str, tok_dir: Path, hf, chat_template):
    w = GGUFWriter(str(path), "llama")
    w.add_name(f"bulkhead-test-tokenizer-{kind}")
    # minimal hparams so llama.cpp's loader (vocab_only) accepts the file
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_rope_dimension_count(64)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    n = write_tokenizer_kv(w, kind, tok_dir, hf, chat_template)
    w.add_vocab_size(n)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llamacpp_vocab(path: Path):
    import llama_cpp
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


def llamacpp_detokenize(llm, ids: list[int]) -> str:
    """llama.cpp's own llama_detokenize (remove_special=False, unparse_special=True); unlike
    llama-cpp-python's Llama.detokenize it applies llama.cpp's SPM leading-space rule."""
    import llama_cpp
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    cap = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(cap)
    n = llama_cpp.llama_detokenize(llm._model.vocab, arr, len(ids), buf, cap, False, True)
    assert 0 <= n <= cap, n
    return buf.raw[:n].decode("utf-8", errors="replace")


def make_tokenizers(state: dict):
    TOK_DIR.mkdir(parents=True, exist_ok=True)
    summary = {}
    for kind in ["spm", "gpt2", "llama3", "qwen2"]:
        d = WORK / f"tok-{kind}"
        if kind == "spm":
            mf = train_spm(d)
            hf = hf_spm_tokenizer(mf, d)
            (d / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
        else:
            hf = train_bytelevel(kind, d)
        tmpl = {"spm": None, "gpt2": None, "llama3": LLAMA3_TEMPLATE, "qwen2": QWEN2_TEMPLATE}[kind]
        gpath = TOK_DIR / f"{kind}.gguf"
        write_vocab_only_gguf(gpath, kind, d, hf, tmpl)
        state[f"tok_{kind}"] = (d, hf)
        try:
            llm = llamacpp_vocab(gpath)
        except Exception as e:  # pragma: no cover
            log(f"!! llama.cpp could not load {gpath}: {e}")
            llm = None
        cases = []
        n_dis = 0
        dis_examples = []
        for text in test_strings(kind):
            ws = hf.encode(text, add_special_tokens=True)
            ns = hf.encode(text, add_special_tokens=False)
            dec = hf.decode(ns, skip_special_tokens=False)
            case = {"text": text, "ids_with_special": ws, "ids_no_special": ns, "decoded": dec}
            if llm is not None:
                lws = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
                lns = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
                ldec = llamacpp_detokenize(llm, lns)
                if lws != ws or lns != ns:
                    case["ids_llamacpp"] = {"with_special": lws, "no_special": lns}
                    n_dis += 1
                    dis_examples.append(text)
                if ldec != dec:
                    case["decoded_llamacpp"] = ldec
            cases.append(case)
        out = {"kind": kind, "source": CORPUS_SOURCE, "vocab_size": len(hf),
               "hf_class": type(hf).__name__, "cases": cases}
        (TOK_DIR / f"{kind}.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        summary[kind] = {"vocab": len(hf), "cases": len(cases), "llamacpp_disagreements": n_dis,
                         "disagreeing_texts": dis_examples}
        log(f"tokenizer {kind}: vocab {len(hf)}, {len(cases)} cases, llama.cpp disagrees on {n_dis}: {dis_examples!r}")
    state["tok_summary"] = summary


# --------------------------------------------------------------------------
# chat templates
# --------------------------------------------------------------------------
def chat_cases():
    return [
        ([{"role": "user", "content": "Hello!"}], True),
        ([{"role": "user", "content": "Hello!"}], False),
        ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}], True),
        ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"},
          {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}], True),
        ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, how can I help?"}], False),
        ([{"role": "user", "content": ""}], True),
        ([{"role": "system", "content": ""}, {"role": "user", "content": "empty system"}], True),
        ([{"role": "user", "content": "caf\u00e9 \U0001F600 \u4e2d\u6587 \u0645\u0631\u062d\u0628\u0627"}], True),
        ([{"role": "user", "content": "  padded with spaces and\nnewlines\n\n  "}], True),
        ([{"role": "user", "content": "first"}, {"role": "assistant", "content": "second"},
          {"role": "user", "content": "third"}, {"role": "assistant", "content": "fourth"}], False),
    ]


def make_chat(state: dict):
    CHAT_DIR.mkdir(parents=True, exist_ok=True)
    for name, kind in [("llama3", "llama3"), ("qwen2", "qwen2")]:
        _, hf = state[f"tok_{kind}"]
        tmpl = LLAMA3_TEMPLATE if name == "llama3" else QWEN2_TEMPLATE
        cases = []
        for msgs, agp in chat_cases():
            r = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp, chat_template=tmpl)
            cases.append({"messages": msgs, "add_generation_prompt": agp, "rendered": r})
        out = {"name": name, "template": tmpl, "bos_token": hf.bos_token, "eos_token": hf.eos_token, "cases": cases}
        (CHAT_DIR / f"{name}.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        log(f"chat {name}: {len(cases)} cases")


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------
FAMILIES = {
    # family: (hf arch, tokenizer kind, hidden, layers, heads, kv heads, ffn, rope theta, tied, chat template)
    "llama": dict(arch="llama", tok="spm", hidden=256, layers=2, heads=4, kv=2, ffn=768, theta=10000.0, tied=False,
                  tmpl=LLAMA3_TEMPLATE, types=["f32", "f16", "q8_0", "q4_0", "q4_k_m"]),
    "qwen2": dict(arch="qwen2", tok="qwen2", hidden=256, layers=2, heads=4, kv=2, ffn=768, theta=1000000.0, tied=True,
                  tmpl=QWEN2_TEMPLATE, types=["f32", "f16", "q8_0", "q4_0", "q4_k_m"]),
    "llama288": dict(arch="llama", tok="spm", hidden=288, layers=2, heads=6, kv=2, ffn=768, theta=10000.0, tied=False,
                     tmpl=LLAMA3_TEMPLATE, types=["f32", "q4_k_m"]),
}
# Small init inside the network keeps it well conditioned (quantization error is not
# amplified chaotically); a larger output projection makes the next-token distribution peaked.
INIT_RANGE = float(os.environ.get("BH_INIT_RANGE", "0.02"))
OUT_STD = float(os.environ.get("BH_OUT_STD", "0.2"))
CTX = 512
MIN_REL_GAP = 5e-3
QUANT_FTYPES = {"q8_0": 7, "q4_0": 2, "q4_k_m": 15}


def build_hf_model(fam: str, spec: dict, n_vocab: int, tok_hf, attempt: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(SEED + sum(map(ord, fam)) + 1000 * attempt)
    common = dict(vocab_size=n_vocab, hidden_size=spec["hidden"], intermediate_size=spec["ffn"],
                  num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
                  num_key_value_heads=spec["kv"], max_position_embeddings=CTX, rms_norm_eps=1e-5,
                  initializer_range=INIT_RANGE, tie_word_embeddings=spec["tied"],
                  rope_parameters={"rope_type": "default", "rope_theta": spec["theta"]},
                  hidden_act="silu", attention_dropout=0.0)
    if spec["arch"] == "llama":
        cfg = LlamaConfig(**common, attention_bias=False, mlp_bias=False,
                          bos_token_id=tok_hf.bos_token_id, eos_token_id=tok_hf.eos_token_id)
        model = LlamaForCausalLM(cfg)
    else:
        cfg = Qwen2Config(**common, use_sliding_window=False,
                          bos_token_id=tok_hf.pad_token_id, eos_token_id=tok_hf.eos_token_id)
        model = Qwen2ForCausalLM(cfg)
    model = model.float().eval()
    g = torch.Generator().manual_seed(SEED + 7 + sum(map(ord, fam)) + 1000 * attempt)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # non-trivial norm weights so a missing norm multiply is caught
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
        if spec["tied"]:
            model.model.embed_tokens.weight.copy_(OUT_STD * torch.randn(model.model.embed_tokens.weight.shape, generator=g))
        else:
            model.lm_head.weight.copy_(OUT_STD * torch.randn(model.lm_head.weight.shape, generator=g))
    if spec["tied"]:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def permute_qk(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    # convert_hf_to_gguf.py LlamaModel.permute
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def write_model_gguf(path: Path, fam: str, spec: dict, model, tok_dir: Path, tok_hf, ftype: str):
    arch = spec["arch"]
    cfg = model.config
    w = GGUFWriter(str(path), arch)
    w.add_name(f"bulkhead-test-{fam}")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(spec["theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    if getattr(cfg, "head_dim", None) is not None:
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    ft = gguf.LlamaFileType.ALL_F32 if ftype == "f32" else gguf.LlamaFileType.MOSTLY_F16
    w.add_file_type(ft)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(head_dim)
    write_tokenizer_kv(w, spec["tok"], tok_dir, tok_hf, spec["tmpl"])

    sd = {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads

    def put(name, arr):
        arr = np.ascontiguousarray(arr.astype(np.float32))
        if ftype == "f16" and arr.ndim > 1 and not name.endswith("_norm.weight"):
            arr = arr.astype(np.float16)
        w.add_tensor(name, arr)

    put("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        q = sd[p + "self_attn.q_proj.weight"]
        k = sd[p + "self_attn.k_proj.weight"]
        if arch == "llama":
            q = permute_qk(q, nh, nh)
            k = permute_qk(k, nh, nkv)
        put(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        put(b + "attn_q.weight", q)
        put(b + "attn_k.weight", k)
        put(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        if arch == "qwen2":
            put(b + "attn_q.bias", sd[p + "self_attn.q_proj.bias"])
            put(b + "attn_k.bias", sd[p + "self_attn.k_proj.bias"])
            put(b + "attn_v.bias", sd[p + "self_attn.v_proj.bias"])
        put(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        put(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        put(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        put(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        put(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    put("output_norm.weight", sd["model.norm.weight"])
    if not spec["tied"]:
        put("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(src: Path, dst: Path, ftype: int):
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {dst}, ftype {ftype}) failed: {rc}")


def type_histogram(path: Path) -> dict:
    r = GGUFReader(str(path))
    c = Counter(t.tensor_type.name for t in r.tensors)
    return dict(sorted(c.items()))


def tensor_types(path: Path) -> dict:
    r = GGUFReader(str(path))
    return {t.name: t.tensor_type.name for t in r.tensors}


def r7(x: float) -> float:
    return float(f"{x:.7g}")


def round_rows(a: np.ndarray) -> list:
    return [[r7(v) for v in row] for row in np.asarray(a, dtype=np.float64)]


def hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False)
    return out.logits[0].double().numpy()


def hf_greedy(model, prompt: list[int], n: int):
    ids = list(prompt)
    gaps = []
    for _ in range(n):
        lg = hf_logits(model, ids)[-1]
        o = np.argsort(-lg)
        gaps.append((lg[o[0]] - lg[o[1]]) / np.max(np.abs(lg)))
        ids.append(int(o[0]))
    return ids[len(prompt):], gaps


def llamacpp_open(path: Path):
    import llama_cpp
    return llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=CTX, n_threads=2, n_threads_batch=2,
                           seed=0, verbose=False, type_k=0, type_v=0, n_batch=CTX, n_ubatch=CTX)


def llamacpp_logits(path: Path, ids: list[int]) -> np.ndarray:
    llm = llamacpp_open(path)
    llm.reset()
    llm.eval(ids)
    out = np.array(llm.scores[: len(ids)], dtype=np.float64)
    llm.close() if hasattr(llm, "close") else None
    return out


def llamacpp_greedy(path: Path, prompt: list[int], n: int) -> list[int]:
    llm = llamacpp_open(path)
    llm.reset()
    llm.eval(prompt)
    out = []
    for _ in range(n):
        lg = np.array(llm.scores[llm.n_tokens - 1])
        t = int(np.argmax(lg))
        out.append(t)
        llm.eval([t])
    llm.close() if hasattr(llm, "close") else None
    return out


PROMPT_TEXT = "The licenses for most software are designed to take away your freedom to share and change it."


def make_models(state: dict):
    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    REF_DIR.mkdir(parents=True, exist_ok=True)
    summary = {}
    for fam, spec in FAMILIES.items():
        tok_dir, tok_hf = state[f"tok_{spec['tok']}"]
        n_vocab = len(tok_hf)
        prompt = tok_hf.encode(PROMPT_TEXT, add_special_tokens=True)[:20]
        assert 16 <= len(prompt) <= 24, len(prompt)
        # Deterministic seed search: take the first seed whose 32-step greedy run has a
        # comfortable top-1/top-2 margin, so greedy decoding is stable across backends.
        for attempt in range(100):
            model = build_hf_model(fam, spec, n_vocab, tok_hf, attempt)
            greedy, gaps = hf_greedy(model, prompt, 32)
            min_gap = float(min(gaps))
            log(f"{fam}: seed attempt {attempt}: greedy min (top1-top2)/max|logit| = {min_gap:.4g}")
            if min_gap >= MIN_REL_GAP:
                break
        else:
            raise RuntimeError(f"{fam}: no seed with a stable greedy run")
        paths = {}
        for t in ["f32", "f16"]:
            if t in spec["types"]:
                paths[t] = MODEL_DIR / f"{fam}-{t}.gguf"
                write_model_gguf(paths[t], fam, spec, model, tok_dir, tok_hf, t)
        for t, ft in QUANT_FTYPES.items():
            if t in spec["types"]:
                paths[t] = MODEL_DIR / f"{fam}-{t}.gguf"
                quantize(paths["f32"], paths[t], ft)

        ref = hf_logits(model, prompt)
        res = {"family": fam, "prompt_tokens": prompt, "vocab_size": n_vocab,
               "transformers_f32_logits": round_rows(ref),
               "greedy": {"prompt_tokens": prompt, "tokens": greedy},
               "greedy_min_relative_gap": r7(min_gap), "seed_attempt": attempt,
               "llamacpp": {}}
        errs, mean_errs = {}, {}
        refmax = float(np.max(np.abs(ref)))
        for t, p in paths.items():
            lg = llamacpp_logits(p, prompt)
            res["llamacpp"][t] = round_rows(lg)
            e = float(np.max(np.abs(lg - ref)) / refmax)
            errs[t] = e
            mean_errs[t] = float(np.mean(np.abs(lg - ref)))
            log(f"  {fam}-{t}: max|llama.cpp - transformers| / max|transformers| = {e:.3e}; argmax agree "
                f"{int(np.sum(lg.argmax(-1) == ref.argmax(-1)))}/{len(prompt)}")
        res["llamacpp_rel_err_vs_transformers"] = {k: r7(v) for k, v in errs.items()}
        res["llamacpp_mean_abs_err_vs_transformers"] = {k: r7(v) for k, v in mean_errs.items()}
        lg_greedy = llamacpp_greedy(paths["f32"], prompt, 32)
        res["llamacpp_greedy_f32"] = lg_greedy
        log(f"  greedy transformers == llama.cpp f32: {lg_greedy == greedy}")
        (REF_DIR / f"{fam}.json").write_text(json.dumps(res, separators=(",", ":")) + "\n")
        summary[fam] = {"errs": errs, "mean_errs": mean_errs, "seed_attempt": attempt, "refmax": refmax, "min_gap": min_gap, "greedy_match": lg_greedy == greedy,
                        "hist": {t: type_histogram(p) for t, p in paths.items()},
                        "types": {t: tensor_types(p) for t, p in paths.items()},
                        "sizes": {t: p.stat().st_size for t, p in paths.items()}}
        if errs["f32"] > 1e-4:
            log(f"!! {fam}: llama.cpp F32 disagrees with transformers ({errs['f32']:.3e}) -- conversion bug?")
    state["model_summary"] = summary


def human(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def render_summary(state: dict) -> str:
    L = []
    ts = state.get("tok_summary", {})
    if ts:
        L.append("### Tokenizers: HF vs llama.cpp\n")
        L.append("| kind | vocab | cases | cases where llama.cpp ids differ from HF | texts |")
        L.append("|---|---|---|---|---|")
        for k, v in ts.items():
            texts = ", ".join("`" + json.dumps(t, ensure_ascii=False)[1:-1].replace("|", "\\|") + "`" for t in v["disagreeing_texts"])
            L.append(f"| {k} | {v['vocab']} | {v['cases']} | {v['llamacpp_disagreements']} | {texts or '-'} |")
        L.append("")
    ms = state.get("model_summary", {})
    if ms:
        L.append("### Models: tensor types, sizes, llama.cpp error vs transformers F32\n")
        L.append("Error = max over prompt positions and vocab of |llama.cpp - transformers| / max |transformers logit|; "
                 "mean = mean |llama.cpp - transformers| (absolute). Argmax = positions where llama.cpp's top-1 equals transformers'.\n")
        L.append("| file | size | tensor types | rel. max err | mean abs err |")
        L.append("|---|---|---|---|---|")
        for fam, v in ms.items():
            for t in v["hist"]:
                hist = ", ".join(f"{k}: {n}" for k, n in v["hist"][t].items())
                L.append(f"| {fam}-{t}.gguf | {human(v['sizes'][t])} | {hist} | {v['errs'][t]:.3e} | {v['mean_errs'][t]:.3e} |")
        L.append("")
        for fam, v in ms.items():
            L.append(f"- {fam}: seed attempt {v['seed_attempt']}, max |logit| {v['refmax']:.3f}, greedy min (top1-top2)/max|logit| = "
                     f"{v['min_gap']:.4g}, llama.cpp F32 greedy == transformers greedy: {v['greedy_match']}")
        L.append("")
        for fam, v in ms.items():
            if "q4_k_m" in v["types"]:
                L.append(f"<details><summary>{fam}-q4_k_m.gguf per-tensor types</summary>\n")
                L.append("| tensor | type |\n|---|---|")
                for n, t in v["types"]["q4_k_m"].items():
                    L.append(f"| {n} | {t} |")
                L.append("\n</details>\n")
    total = sum(p.stat().st_size for p in FIX.rglob("*") if p.is_file())
    L.append(f"Total size of tests/fixtures: {human(total)}.")
    return "\n".join(L) + "\n"


def update_readme(state: dict):
    readme = Path(__file__).with_name("README.md")
    if not readme.exists():
        return
    text = readme.read_text(encoding="utf-8")
    b, e = "<!-- BEGIN GENERATED -->", "<!-- END GENERATED -->"
    if b not in text or e not in text:
        return
    pre, rest = text.split(b, 1)
    _, post = rest.split(e, 1)
    readme.write_text(pre + b + "\n" + render_summary(state) + e + post, encoding="utf-8")
    log(f"updated {readme}")


TOOL_PACKAGES = ["torch", "transformers", "tokenizers", "sentencepiece", "gguf", "llama_cpp_python",
                 "numpy", "protobuf"]


def record_tools():
    """tests/fixtures/tools.json: the exact versions this run made the fixtures with."""
    from importlib.metadata import version
    tools = {"python": sys.version.split()[0]}
    for name in TOOL_PACKAGES:
        tools[name] = version(name.replace("_", "-"))
    out = {"made_by": "tests/reference/make_fixtures.py", "tools": tools}
    (FIX / "tools.json").write_text(json.dumps(out, indent=1) + "\n")
    log(f"tools: {tools}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="tok,chat,models")
    ap.add_argument("--summary", default=None, help="also write a JSON summary here")
    a = ap.parse_args()
    assert torch is not None, "make_fixtures.py needs torch: run tests/reference/setup.sh"
    random.seed(SEED); np.random.seed(SEED); torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(2)
    only = set(a.only.split(","))
    state: dict = {}
    record_tools()
    make_tokenizers(state)  # always needed (models/chat use the tokenizers)
    if "chat" in only:
        make_chat(state)
    if "models" in only:
        make_models(state)
    if only >= {"chat", "models"}:
        update_readme(state)
    summ = {k: v for k, v in state.items() if k.endswith("summary")}
    if a.summary:
        Path(a.summary).write_text(json.dumps(summ, indent=1, default=str))
        log(f"summary written to {a.summary}")
    shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
