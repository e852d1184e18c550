#!/usr/bin/env python3
"""Mixture-of-experts fixtures: tiny random-weight models built with
transformers' own classes, converted to GGUF by llama.cpp's
convert_hf_to_gguf.py from the pinned llama-cpp-python sdist, quantized by
llama.cpp, with transformers' and llama.cpp's logits.

Run from the repository root (the venv of setup.sh):
    tests/reference/.venv/bin/python tests/reference/make_moe.py [--only mixtral,qwen3moe]

Writes, per family F (see FAMILIES):
    tests/fixtures/models/F-{f32,q8_0,q4_0}.gguf
    tests/fixtures/reference/F.json     (the schema of make_fixtures.py's <family>.json)

The sdist (llama-cpp-python==SDIST_VERSION, sha256 SDIST_SHA256) is fetched
with pip into $BULKHEAD_LLCPP_SDIST (default /var/tmp/llcpp-sdist), checked,
and unpacked there once; its vendor/llama.cpp/convert_hf_to_gguf.py runs
with its own gguf-py. The tokenizer is make_fixtures.py's SentencePiece one
(trained again here, deterministically). See tests/reference/README.md.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402  (tokenizer, llama.cpp helpers, settings)

import numpy as np  # noqa: E402
import torch  # noqa: E402

SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_DIR = Path(os.environ.get("BULKHEAD_LLCPP_SDIST", "/var/tmp/llcpp-sdist"))

FAMILIES = {
    # Mixtral: GGUF arch "llama" with llama.expert_count / expert_used_count.
    "mixtral": dict(tok="spm", hidden=128, layers=2, heads=4, kv=2, ffn=256, experts=4, used=2,
                    theta=10000.0, types=["f32", "q8_0", "q4_0"]),
    # Qwen3-MoE: arch "qwen3moe", q/k norm, head_dim 64 (not hidden / heads,
    # as in the real models), experts of width moe_intermediate_size,
    # norm_topk_prob (the only routing a qwen3moe GGUF expresses).
    "qwen3moe": dict(tok="qwen2", hidden=128, layers=2, heads=4, kv=2, head_dim=64, ffn=128, dense_ffn=256,
                     experts=4, used=2, theta=1000000.0, types=["f32", "q8_0", "q4_0"]),
}
QUANT_FTYPES = {"q8_0": 7, "q4_0": 2}
# The router's weights are drawn wider than the init (0.02) so each token's
# choice of experts is clear-cut: the k-th and (k+1)-th router logits at
# least MIN_ROUTER_GAP apart at every layer and position of the prompt and
# the greedy continuation, so float rounding (ours, llama.cpp's) never
# flips a choice.
ROUTER_STD = 0.1
MIN_ROUTER_GAP = 0.02
PROMPT_LEN = 20
GREEDY = 32


def log(*a):
    mf.log(*a)


def converter() -> Path:
    """convert_hf_to_gguf.py of the pinned sdist (fetched and checked once)."""
    tarball = SDIST_DIR / f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    if not tarball.exists():
        SDIST_DIR.mkdir(parents=True, exist_ok=True)
        log(f"fetching llama-cpp-python {SDIST_VERSION} sdist into {SDIST_DIR}")
        # --no-binary for this package only: its build dependencies (cmake
        # among them) come as wheels rather than being compiled too.
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", "llama-cpp-python",
                        f"llama-cpp-python=={SDIST_VERSION}", "-d", str(SDIST_DIR)], check=True)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        sys.exit(f"{tarball}: sha256 {digest}, expected {SDIST_SHA256}")
    root = SDIST_DIR / f"llama_cpp_python-{SDIST_VERSION}"
    script = root / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    if not script.exists():
        with tarfile.open(tarball) as tar:
            tar.extractall(SDIST_DIR, filter="data")
    return script


def tokenizer(kind: str):
    """make_fixtures.py's tokenizer of that kind: (its folder, HF tokenizer)."""
    d = mf.WORK / f"tok-{kind}"
    if kind == "spm":
        return d, mf.hf_spm_tokenizer(mf.train_spm(d), d)
    return d, mf.train_bytelevel(kind, d)


def build_mixtral(spec: dict, n_vocab: int, tok, attempt: int):
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(mf.SEED + 31 + 1000 * attempt)
    cfg = MixtralConfig(vocab_size=n_vocab, hidden_size=spec["hidden"], intermediate_size=spec["ffn"],
                        num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
                        num_key_value_heads=spec["kv"], num_local_experts=spec["experts"],
                        num_experts_per_tok=spec["used"], max_position_embeddings=mf.CTX, rms_norm_eps=1e-5,
                        initializer_range=mf.INIT_RANGE, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "default", "rope_theta": spec["theta"]},
                        hidden_act="silu", attention_dropout=0.0, router_jitter_noise=0.0,
                        sliding_window=None, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = MixtralForCausalLM(cfg).float().eval()
    g = torch.Generator().manual_seed(mf.SEED + 37 + 1000 * attempt)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(ROUTER_STD * torch.randn(p.shape, generator=g))
        model.lm_head.weight.copy_(mf.OUT_STD * torch.randn(model.lm_head.weight.shape, generator=g))
    return model


def build_qwen3moe(spec: dict, n_vocab: int, tok, attempt: int):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    torch.manual_seed(mf.SEED + 41 + 1000 * attempt)
    cfg = Qwen3MoeConfig(vocab_size=n_vocab, hidden_size=spec["hidden"], intermediate_size=spec["dense_ffn"],
                         moe_intermediate_size=spec["ffn"], num_hidden_layers=spec["layers"],
                         num_attention_heads=spec["heads"], num_key_value_heads=spec["kv"],
                         head_dim=spec["head_dim"], num_experts=spec["experts"],
                         num_experts_per_tok=spec["used"], norm_topk_prob=True, decoder_sparse_step=1,
                         mlp_only_layers=[], max_position_embeddings=mf.CTX, rms_norm_eps=1e-6,
                         initializer_range=mf.INIT_RANGE, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": spec["theta"]},
                         hidden_act="silu", attention_dropout=0.0, attention_bias=False,
                         use_sliding_window=False, bos_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id)
    model = Qwen3MoeForCausalLM(cfg).float().eval()
    g = torch.Generator().manual_seed(mf.SEED + 43 + 1000 * attempt)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # the q/k norms too
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(ROUTER_STD * torch.randn(p.shape, generator=g))
        model.lm_head.weight.copy_(mf.OUT_STD * torch.randn(model.lm_head.weight.shape, generator=g))
    return model


BUILDERS = {"mixtral": build_mixtral, "qwen3moe": build_qwen3moe}
# convert_hf_to_gguf.py names a byte-level BPE tokenizer's pre-tokenizer by
# the hash of its ids on a test text, which only the published vocabularies
# have; ours are trained here, so the converter is told which it is.
PRE_TOKENIZER = {"qwen2": "qwen2"}


def router_min_gap(model, ids: list[int], k: int) -> float:
    """The smallest (k-th − (k+1)-th) router logit over every layer and position."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False, output_router_logits=True)
    gaps = []
    for logits in out.router_logits:  # one [positions, experts] per layer
        top = torch.sort(logits.double(), dim=-1, descending=True).values
        gaps.append(float((top[:, k - 1] - top[:, k]).min()))
    return min(gaps)


# Runs the converter as its own __main__, after pointing the base class's
# pre-tokenizer lookup at a fixed name (see PRE_TOKENIZER).
CONVERT_WITH_PRE = """
import runpy, sys
script, pre = sys.argv[1], sys.argv[2]
sys.argv = [script] + sys.argv[3:]
root = script.rsplit("/", 1)[0]
sys.path[0:0] = [root, root + "/gguf-py"]
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
runpy.run_path(script, run_name="__main__")
"""


def convert(model, tok, tok_dir: Path, fam: str, kind: str) -> Path:
    """save_pretrained, then convert_hf_to_gguf.py --outtype f32 into the fixtures."""
    hf_dir = mf.WORK / f"hf-{fam}"
    model.save_pretrained(str(hf_dir))
    tok.save_pretrained(str(hf_dir))
    if kind == "spm":
        (hf_dir / "tokenizer.model").write_bytes((tok_dir / "tokenizer.model").read_bytes())
    out = mf.MODEL_DIR / f"{fam}-f32.gguf"
    args = [str(hf_dir), "--outfile", str(out), "--outtype", "f32"]
    if kind in PRE_TOKENIZER:
        cmd = [sys.executable, "-c", CONVERT_WITH_PRE, str(converter()), PRE_TOKENIZER[kind], *args]
    else:
        cmd = [sys.executable, str(converter()), *args]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def errors(ours: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    diff = np.abs(ours - ref)
    return float(diff.max() / np.abs(ref).max()), float(np.mean(diff))


def make_family(fam: str, spec: dict) -> dict:
    tok_dir, tok = tokenizer(spec["tok"])
    prompt = tok.encode(mf.PROMPT_TEXT, add_special_tokens=True)[:PROMPT_LEN]
    for attempt in range(100):
        model = BUILDERS[fam](spec, len(tok), tok, attempt)
        greedy, gaps = mf.hf_greedy(model, prompt, GREEDY)
        min_gap = float(min(gaps))
        r_gap = router_min_gap(model, prompt + greedy, spec["used"])
        log(f"{fam}: attempt {attempt}: greedy gap {min_gap:.4g}, router gap {r_gap:.4g}")
        if min_gap >= mf.MIN_REL_GAP and r_gap >= MIN_ROUTER_GAP:
            break
    else:
        sys.exit(f"{fam}: no seed attempt met the margins")
    hf = mf.hf_logits(model, prompt)
    f32 = convert(model, tok, tok_dir, fam, spec["tok"])
    files = {"f32": f32}
    for ty in spec["types"]:
        if ty != "f32":
            files[ty] = mf.MODEL_DIR / f"{fam}-{ty}.gguf"
            mf.quantize(f32, files[ty], QUANT_FTYPES[ty])
    llamacpp, rel, mean = {}, {}, {}
    for ty, path in files.items():
        lg = mf.llamacpp_logits(path, prompt)
        llamacpp[ty] = mf.round_rows(lg)
        rel[ty], mean[ty] = errors(lg, hf)
        log(f"{path.name}: {mf.type_histogram(path)} max rel {rel[ty]:.3e} mean abs {mean[ty]:.3e}")
    lc_greedy = mf.llamacpp_greedy(f32, prompt, GREEDY)
    out = {
        "family": fam,
        "hf_class": type(model).__name__,
        "config": {k: v for k, v in spec.items() if k not in ("types", "tok")},
        "prompt_tokens": prompt,
        "vocab_size": len(tok),
        "transformers_f32_logits": mf.round_rows(hf),
        "greedy": {"prompt_tokens": prompt, "tokens": greedy},
        "greedy_min_relative_gap": min_gap,
        "router_min_gap": r_gap,
        "seed_attempt": attempt,
        "llamacpp": llamacpp,
        "llamacpp_rel_err_vs_transformers": rel,
        "llamacpp_mean_abs_err_vs_transformers": mean,
        "llamacpp_greedy_f32": lc_greedy,
        "tensor_types": {ty: mf.type_histogram(p) for ty, p in files.items()},
        "converter": {"llama_cpp_python_sdist": SDIST_VERSION, "sha256": SDIST_SHA256,
                      "script": "vendor/llama.cpp/convert_hf_to_gguf.py --outtype f32"},
        "tools": tool_versions(),
    }
    (mf.REF_DIR / f"{fam}.json").write_text(json.dumps(out) + "\n")
    log(f"{fam}: llama.cpp F32 greedy == transformers greedy: {lc_greedy == greedy}")
    return out


def tool_versions() -> dict:
    from importlib.metadata import version
    tools = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "tokenizers", "sentencepiece", "gguf", "llama_cpp_python", "numpy"):
        tools[name] = version(name.replace("_", "-"))
    return tools


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="mixtral,qwen3moe", help="families, comma-separated")
    a = ap.parse_args()
    torch.manual_seed(mf.SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(2)
    for fam in a.only.split(","):
        make_family(fam, FAMILIES[fam])


if __name__ == "__main__":
    main()
