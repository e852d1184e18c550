#!/usr/bin/env python3
"""Fixtures for the model families beyond Llama 2 and Qwen2: Llama 3.1 RoPE
scaling, Qwen2 with YaRN, Qwen3, Phi-3, Gemma 2 and Gemma 3 (text).

Run from the repository root, after tests/reference/setup.sh:
    tests/reference/.venv/bin/python tests/reference/make_families.py [--only tok,chat,models]

Each model is built with transformers' own class from random weights, saved
with save_pretrained beside its tokenizer, and converted to GGUF by
llama.cpp's convert_hf_to_gguf.py from the llama-cpp-python sdist pinned
below (fetched with pip and checked against its SHA-256), then quantized by
llama.cpp.  Recorded per family: transformers F32 logits, llama.cpp logits
for every file, and greedy tokens.  make_fixtures.py's files are not touched.
See tests/reference/README.md.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402  (tokenizer training, references, quantizer)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gguf import GGUFReader  # noqa: E402

LLAMA_CPP_PYTHON = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_DIR = Path(os.environ.get("BH_LLCPP_SDIST", "/var/tmp/llcpp-sdist"))

FIX = mf.FIX
SEED = mf.SEED
CTX = 512

# Chat templates: the common public forms of the two prompt formats (Gemma's
# as Gemma 3 writes it, which folds a system message into the first turn).
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
PHI3_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)
PHI3_ADDED = ["<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>", "<|placeholder3|>",
              "<|placeholder4|>", "<|system|>", "<|end|>", "<|placeholder5|>", "<|placeholder6|>", "<|user|>"]
SMALL_VOCAB = 512

log = mf.log


# --------------------------------------------------------------------------
# llama.cpp's converter, from the pinned sdist
# --------------------------------------------------------------------------
def llamacpp_source() -> Path:
    """vendor/llama.cpp of the llama-cpp-python sdist (downloaded with pip once,
    checked against SDIST_SHA256, extracted beside the tarball)."""
    SDIST_DIR.mkdir(parents=True, exist_ok=True)
    tarball = SDIST_DIR / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not tarball.exists():
        # --no-binary for this package only: its build dependencies come as
        # wheels (":all:" would compile cmake from source just to read metadata).
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                        f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(SDIST_DIR)], check=True)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise SystemExit(f"{tarball}: sha256 {digest}, expected {SDIST_SHA256}")
    root = SDIST_DIR / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    if not (root / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py").exists():
        with tarfile.open(tarball) as t:
            t.extractall(SDIST_DIR, filter="data")
    return root / "vendor" / "llama.cpp"


def convert(model_dir: Path, out: Path, name: str, vocab_only: bool = False):
    script = llamacpp_source() / "convert_hf_to_gguf.py"
    cmd = [sys.executable, str(script), "--outtype", "f32", "--outfile", str(out), "--model-name", name]
    if vocab_only:
        cmd.append("--vocab-only")
    res = subprocess.run(cmd + [str(model_dir)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py {model_dir} failed:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}")


# --------------------------------------------------------------------------
# tokenizers
# --------------------------------------------------------------------------
def train_small_spm(outdir: Path, *, dummy_prefix: bool, gemma: bool) -> Path:
    import sentencepiece as spm
    outdir.mkdir(parents=True, exist_ok=True)
    txt = outdir / "corpus.txt"
    txt.write_text("\n".join(l for l in mf.corpus_lines() if l.strip()), encoding="utf-8")
    ids = (dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
                unk_piece="<unk>", control_symbols=["<mask>"],
                user_defined_symbols=["<start_of_turn>", "<end_of_turn>"])
           if gemma else dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1))
    spm.SentencePieceTrainer.train(
        input=str(txt), model_prefix=str(outdir / "tokenizer"), model_type="bpe", vocab_size=SMALL_VOCAB,
        character_coverage=1.0, byte_fallback=True, split_digits=True, allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity", add_dummy_prefix=dummy_prefix,
        num_threads=1, shuffle_input_sentence=False, input_sentence_size=0, seed_sentencepiece_size=100000,
        max_sentence_length=100000, minloglevel=2, **ids)
    return outdir / "tokenizer.model"


def make_gemma_tokenizer(d: Path):
    """Gemma's shape: SentencePiece BPE with byte fallback, no dummy prefix,
    <pad> <eos> <bos> <unk> <mask> first, the turn markers special."""
    from transformers import GemmaTokenizer
    model = train_small_spm(d / "spm", dummy_prefix=False, gemma=True)
    src = d / "src"
    src.mkdir(parents=True, exist_ok=True)
    shutil.copy(model, src / "tokenizer.model")
    tok = GemmaTokenizer.from_pretrained(str(src), add_bos_token=True, add_eos_token=False,
                                         extra_special_tokens=["<start_of_turn>", "<end_of_turn>"])
    tok.chat_template = GEMMA_TEMPLATE
    return tok


def make_phi3_tokenizer(d: Path):
    """Phi-3's shape: a Llama SentencePiece vocabulary (dummy prefix, legacy
    spacing) and Phi-3's special tokens appended after it."""
    from tokenizers import AddedToken
    from transformers import LlamaTokenizerFast
    model = train_small_spm(d / "spm", dummy_prefix=True, gemma=False)
    src = d / "src"
    src.mkdir(parents=True, exist_ok=True)
    shutil.copy(model, src / "tokenizer.model")
    tok = LlamaTokenizerFast.from_pretrained(str(src), legacy=True, add_bos_token=True, add_eos_token=False)
    tok.add_tokens([AddedToken(s, special=True, normalized=False) for s in PHI3_ADDED], special_tokens=True)
    tok.eos_token = "<|endoftext|>"
    tok.pad_token = "<|endoftext|>"
    tok.chat_template = PHI3_TEMPLATE
    return tok


def save_tokenizer(tok, spm_model: Path, out: Path):
    """save_pretrained, plus what the Hub's repositories of these models carry
    and transformers 5 no longer writes: tokenizer.model, and the added
    tokens in tokenizer_config.json (where convert_hf_to_gguf.py reads them)."""
    tok.save_pretrained(str(out))
    shutil.copy(spm_model, out / "tokenizer.model")
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["added_tokens_decoder"] = {
        str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip,
                 "single_word": t.single_word, "special": t.special}
        for i, t in sorted(tok.added_tokens_decoder.items())}
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False))


def tokenizer_cases(kind: str) -> list[str]:
    base = mf.test_strings("spm")[:-4]  # the shared hard strings, without spm's specials
    specials = {
        "gemma": ["<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "text <start_of_turn> in",
                  "<bos>hello<eos>", "<pad><mask><unk>", "a<end_of_turn>b"],
        "phi3": ["<|user|>\nHello<|end|>\n<|assistant|>\n", "text <|end|> in the middle",
                 "<s>hello</s>", "<|endoftext|>", "a<|system|>b <|placeholder1|>"],
    }
    return base + specials[kind]


def record_tokenizer(kind: str, tok, gguf_path: Path):
    cases = []
    try:
        llm = mf.llamacpp_vocab(gguf_path)
    except Exception as e:  # pragma: no cover
        log(f"!! llama.cpp could not load {gguf_path}: {e}")
        llm = None
    disagree = []
    for text in tokenizer_cases(kind):
        ws = tok.encode(text, add_special_tokens=True)
        ns = tok.encode(text, add_special_tokens=False)
        case = {"text": text, "ids_with_special": ws, "ids_no_special": ns,
                "decoded": tok.decode(ns, skip_special_tokens=False)}
        if llm is not None:
            lws = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
            lns = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
            if lws != ws or lns != ns:
                case["ids_llamacpp"] = {"with_special": lws, "no_special": lns}
                disagree.append(text)
            ldec = mf.llamacpp_detokenize(llm, lns)
            if ldec != case["decoded"]:
                case["decoded_llamacpp"] = ldec
        cases.append(case)
    out = {"kind": kind, "source": mf.CORPUS_SOURCE, "vocab_size": len(tok), "hf_class": type(tok).__name__,
           "made_by": "tests/reference/make_families.py", "cases": cases}
    (FIX / "tokenizers" / f"{kind}.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n",
                                                    encoding="utf-8")
    log(f"tokenizer {kind}: vocab {len(tok)}, {len(cases)} cases, llama.cpp disagrees on {len(disagree)}: {disagree!r}")
    return {"vocab": len(tok), "cases": len(cases), "llamacpp_disagreements": len(disagree),
            "disagreeing_texts": disagree}


def record_chat(name: str, tok, template: str):
    cases = []
    for msgs, agp in mf.chat_cases():
        r = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp, chat_template=template)
        cases.append({"messages": msgs, "add_generation_prompt": agp, "rendered": r})
    out = {"name": name, "template": template, "bos_token": tok.bos_token, "eos_token": tok.eos_token,
           "cases": cases}
    (FIX / "chat" / f"{name}.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    log(f"chat {name}: {len(cases)} cases")


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------
# Small shapes (a few MB each); every family has a feature the test must see:
# llama31: original context 32 so most RoPE pairs are rescaled; qwen2yarn:
# original context 128, factor 4; qwen3: heads wider than width/heads;
# phi3: GQA through the fused QKV; gemma2: a window of 8 (< the 20-token
# prompt) and a tight score cap; gemma3: six layers (five sliding, one
# global), a linear factor on the global layers' RoPE.
FAMILIES = {
    "llama31": dict(cls="LlamaForCausalLM", tok="spm", hidden=64, layers=2, heads=2, kv=1, ffn=192, tied=False,
                    quant="q4_0",
                    extra=dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 32})),
    "qwen2yarn": dict(cls="Qwen2ForCausalLM", tok="spm", hidden=64, layers=2, heads=2, kv=1, ffn=192, tied=True,
                      quant="q8_0",
                      extra=dict(use_sliding_window=False,
                                 rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                                  "original_max_position_embeddings": 128})),
    "qwen3": dict(cls="Qwen3ForCausalLM", tok="spm", hidden=64, layers=2, heads=4, kv=2, ffn=192, tied=True,
                  quant="q4_0",
                  extra=dict(head_dim=32, use_sliding_window=False,
                             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "phi3": dict(cls="Phi3ForCausalLM", tok="phi3", hidden=64, layers=2, heads=4, kv=2, ffn=192, tied=False,
                 quant="q8_0",
                 extra=dict(original_max_position_embeddings=CTX,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "gemma2": dict(cls="Gemma2ForCausalLM", tok="gemma", hidden=64, layers=2, heads=4, kv=2, ffn=192, tied=True,
                   quant="q4_0", qk_std=0.25,
                   extra=dict(head_dim=32, query_pre_attn_scalar=32, sliding_window=8, attn_logit_softcapping=5.0,
                              final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "gemma3": dict(cls="Gemma3ForCausalLM", tok="gemma", hidden=64, layers=6, heads=2, kv=1, ffn=128, tied=True,
                   quant="q8_0",
                   extra=dict(head_dim=32, query_pre_attn_scalar=32, sliding_window=8,
                              hidden_activation="gelu_pytorch_tanh",
                              rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                  "rope_theta": 1000000.0},
                                               "sliding_attention": {"rope_type": "default",
                                                                     "rope_theta": 10000.0}})),
}
QUANT_FTYPES = {"q8_0": 7, "q4_0": 2}


def build_model(fam: str, spec: dict, tok, attempt: int):
    import transformers
    cls = getattr(transformers, spec["cls"])
    cfg_cls = getattr(transformers, spec["cls"].replace("ForCausalLM", "Config").replace("Gemma3Config", "Gemma3TextConfig"))
    torch.manual_seed(SEED + sum(map(ord, fam)) + 1000 * attempt)
    gemma = fam.startswith("gemma")
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    cfg = cfg_cls(vocab_size=len(tok), hidden_size=spec["hidden"], intermediate_size=spec["ffn"],
                  num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
                  num_key_value_heads=spec["kv"], max_position_embeddings=CTX, rms_norm_eps=1e-6 if gemma else 1e-5,
                  initializer_range=mf.INIT_RANGE, tie_word_embeddings=spec["tied"], attention_dropout=0.0,
                  **ids, **spec["extra"])
    cfg._attn_implementation = "eager"
    cfg.architectures = [spec["cls"]]
    model = cls(cfg).float().eval()
    g = torch.Generator().manual_seed(SEED + 7 + sum(map(ord, fam)) + 1000 * attempt)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # Gemma's norms scale by (1 + w): the same spread around 1.
                p.copy_((0.0 if gemma else 1.0) + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "qk_std" in spec and (name.endswith("q_proj.weight") or name.endswith("k_proj.weight")):
                # Scores far from 0, so the soft cap and the window matter.
                p.copy_(spec["qk_std"] * torch.randn(p.shape, generator=g))
        head = model.model.embed_tokens.weight if spec["tied"] else model.lm_head.weight
        head.copy_(mf.OUT_STD * torch.randn(head.shape, generator=g))
    return model


def greedy_gap_ok(model, prompt):
    greedy, gaps = mf.hf_greedy(model, prompt, 32)
    return greedy, float(min(gaps))


def make_models(toks: dict, summary: dict):
    models = FIX / "models"
    work = mf.WORK / "families"
    for fam, spec in FAMILIES.items():
        tok, spm_model = toks[spec["tok"]]
        prompt = tok.encode(mf.PROMPT_TEXT, add_special_tokens=True)[:20]
        assert 16 <= len(prompt) <= 24, len(prompt)
        for attempt in range(100):
            model = build_model(fam, spec, tok, attempt)
            greedy, min_gap = greedy_gap_ok(model, prompt)
            log(f"{fam}: seed attempt {attempt}: greedy min (top1-top2)/max|logit| = {min_gap:.4g}")
            if min_gap >= mf.MIN_REL_GAP:
                break
        else:
            raise RuntimeError(f"{fam}: no seed with a stable greedy run")
        hf_dir = work / fam
        model.save_pretrained(str(hf_dir))
        save_tokenizer(tok, spm_model, hf_dir)
        paths = {"f32": models / f"{fam}-f32.gguf"}
        convert(hf_dir, paths["f32"], f"bulkhead-test-{fam}")
        q = spec["quant"]
        paths[q] = models / f"{fam}-{q}.gguf"
        mf.quantize(paths["f32"], paths[q], QUANT_FTYPES[q])

        ref = mf.hf_logits(model, prompt)
        res = {"family": fam, "made_by": "tests/reference/make_families.py", "hf_class": spec["cls"],
               "prompt_tokens": prompt, "vocab_size": len(tok),
               "transformers_f32_logits": mf.round_rows(ref),
               "greedy": {"prompt_tokens": prompt, "tokens": greedy},
               "greedy_min_relative_gap": mf.r7(min_gap), "seed_attempt": attempt, "llamacpp": {}}
        errs, mean_errs = {}, {}
        refmax = float(np.max(np.abs(ref)))
        for t, p in paths.items():
            lg = mf.llamacpp_logits(p, prompt)
            res["llamacpp"][t] = mf.round_rows(lg)
            errs[t] = float(np.max(np.abs(lg - ref)) / refmax)
            mean_errs[t] = float(np.mean(np.abs(lg - ref)))
            log(f"  {fam}-{t}: max|llama.cpp - transformers| / max|transformers| = {errs[t]:.3e}")
        res["llamacpp_rel_err_vs_transformers"] = {k: mf.r7(v) for k, v in errs.items()}
        res["llamacpp_mean_abs_err_vs_transformers"] = {k: mf.r7(v) for k, v in mean_errs.items()}
        lg_greedy = mf.llamacpp_greedy(paths["f32"], prompt, 32)
        res["llamacpp_greedy_f32"] = lg_greedy
        (FIX / "reference" / f"{fam}.json").write_text(json.dumps(res, separators=(",", ":")) + "\n")
        summary[fam] = {"errs": errs, "mean_errs": mean_errs, "seed_attempt": attempt, "refmax": refmax,
                        "min_gap": min_gap, "greedy_match": lg_greedy == greedy,
                        "hist": {t: mf.type_histogram(p) for t, p in paths.items()},
                        "sizes": {t: p.stat().st_size for t, p in paths.items()}}
        if errs["f32"] > 1e-4:
            # Expected for Gemma: llama.cpp's GELU is an f16 table (README).
            log(f"!! {fam}: llama.cpp F32 disagrees with transformers ({errs['f32']:.3e})")


def make_tokenizers_and_chat(only: set, summary: dict) -> dict:
    """The tokenizers every family needs: the existing `spm` kind (trained as
    make_fixtures.py does) for the Llama and Qwen models, and new Gemma and
    Phi-3 kinds whose fixtures this script writes."""
    toks = {}
    d = mf.WORK / "tok-spm"
    spm_model = mf.train_spm(d)
    toks["spm"] = (mf.hf_spm_tokenizer(spm_model, d), spm_model)
    for kind, make in [("gemma", make_gemma_tokenizer), ("phi3", make_phi3_tokenizer)]:
        d = mf.WORK / f"tok-{kind}"
        tok = make(d)
        toks[kind] = (tok, d / "spm" / "tokenizer.model")
        if "tok" in only:
            # A vocab-only GGUF, written by the converter from a saved model
            # directory (it needs a config; the family's own is used).
            vocab_dir = d / "vocab"
            save_tokenizer(tok, d / "spm" / "tokenizer.model", vocab_dir)
            fam = "gemma2" if kind == "gemma" else "phi3"
            build_model(fam, FAMILIES[fam], tok, 0).config.save_pretrained(str(vocab_dir))
            gguf_path = FIX / "tokenizers" / f"{kind}.gguf"
            convert(vocab_dir, gguf_path, f"bulkhead-test-tokenizer-{kind}", vocab_only=True)
            summary[f"tok_{kind}"] = record_tokenizer(kind, tok, gguf_path)
        if "chat" in only:
            record_chat(kind, tok, GEMMA_TEMPLATE if kind == "gemma" else PHI3_TEMPLATE)
    return toks


def render_summary(summary: dict) -> str:
    L = []
    toks = {k[4:]: v for k, v in summary.items() if k.startswith("tok_")}
    if toks:
        L.append("### Tokenizers: HF vs llama.cpp\n")
        L.append("| kind | vocab | cases | cases where llama.cpp ids differ from HF | texts |")
        L.append("|---|---|---|---|---|")
        for k, v in toks.items():
            texts = ", ".join("`" + json.dumps(t, ensure_ascii=False)[1:-1].replace("|", "\\|") + "`"
                              for t in v["disagreeing_texts"])
            L.append(f"| {k} | {v['vocab']} | {v['cases']} | {v['llamacpp_disagreements']} | {texts or '-'} |")
        L.append("")
    fams = {k: v for k, v in summary.items() if k in FAMILIES}
    if fams:
        L.append("### Models: llama.cpp error vs transformers F32\n")
        L.append("| file | size | tensor types | rel. max err | mean abs err |")
        L.append("|---|---|---|---|---|")
        for fam, v in fams.items():
            for t in v["hist"]:
                hist = ", ".join(f"{k}: {n}" for k, n in v["hist"][t].items())
                L.append(f"| {fam}-{t}.gguf | {mf.human(v['sizes'][t])} | {hist} | {v['errs'][t]:.3e} | "
                         f"{v['mean_errs'][t]:.3e} |")
        L.append("")
        for fam, v in fams.items():
            L.append(f"- {fam}: seed attempt {v['seed_attempt']}, max |logit| {v['refmax']:.3f}, greedy min "
                     f"(top1-top2)/max|logit| = {v['min_gap']:.4g}, llama.cpp F32 greedy == transformers greedy: "
                     f"{v['greedy_match']}")
        L.append("")
    new = [p for fam in FAMILIES for p in (FIX / "models").glob(f"{fam}-*.gguf")]
    new += [FIX / "reference" / f"{fam}.json" for fam in FAMILIES]
    new += [FIX / d / f"{k}.{e}" for k in ["gemma", "phi3"] for d, e in [("tokenizers", "gguf"),
                                                                       ("tokenizers", "json"), ("chat", "json")]]
    total = sum(p.stat().st_size for p in new if p.exists())
    L.append(f"Total size of these fixtures: {mf.human(total)}.")
    return "\n".join(L) + "\n"


def update_readme(summary: dict):
    readme = Path(__file__).with_name("README.md")
    text = readme.read_text(encoding="utf-8")
    b, e = "<!-- BEGIN FAMILIES -->", "<!-- END FAMILIES -->"
    if b not in text or e not in text:
        return
    pre, rest = text.split(b, 1)
    _, post = rest.split(e, 1)
    readme.write_text(pre + b + "\n" + render_summary(summary) + e + post, encoding="utf-8")
    log(f"updated {readme}")


def record_tools() -> dict:
    from importlib.metadata import version
    tools = {"python": sys.version.split()[0], "llama_cpp_python_sdist": f"{LLAMA_CPP_PYTHON} sha256:{SDIST_SHA256}"}
    for name in mf.TOOL_PACKAGES:
        tools[name] = version(name.replace("_", "-"))
    out = {"made_by": "tests/reference/make_families.py", "tools": tools}
    (FIX / "families-tools.json").write_text(json.dumps(out, indent=1) + "\n")
    return tools


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="tok,chat,models")
    a = ap.parse_args()
    only = set(a.only.split(","))
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(2)
    llamacpp_source()
    log(f"tools: {record_tools()}")
    summary: dict = {}
    toks = make_tokenizers_and_chat(only, summary)
    if "models" in only:
        make_models(toks, summary)
    if only >= {"tok", "models"}:
        update_readme(summary)
    shutil.rmtree(mf.WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
