#!/usr/bin/env python3
"""IQ4_NL and IQ4_XS fixtures: the committed llama F32 fixture quantized by
llama.cpp, and llama.cpp's logits on them.

Run from the repository root (the venv of setup.sh):
    tests/reference/.venv/bin/python tests/reference/make_iq4.py

Reads tests/fixtures/models/llama-f32.gguf and the prompt and transformers F32
logits of tests/fixtures/reference/llama.json (both made by make_fixtures.py,
which this script does not change), writes

    tests/fixtures/models/llama-iq4_nl.gguf   llama_model_quantize, ftype 25 (MOSTLY_IQ4_NL)
    tests/fixtures/models/llama-iq4_xs.gguf   llama_model_quantize, ftype 30 (MOSTLY_IQ4_XS)
    tests/fixtures/reference/llama-iq4.json   llama.cpp's logits on both, and their error

No importance matrix: llama.cpp requires one only for the IQ1/IQ2/IQ3_XXS
types (tensor_requires_imatrix in src/llama-quant.cpp); without one it keeps
the first eighth of the ffn_down layers at a wider type. See
tests/reference/README.md.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402  (helpers and settings shared with the main fixtures)

import numpy as np  # noqa: E402

FTYPES = {"iq4_nl": 25, "iq4_xs": 30}


def tool_versions() -> dict:
    from importlib.metadata import version
    tools = {"python": sys.version.split()[0]}
    for name in ("gguf", "llama_cpp_python", "numpy"):
        tools[name] = version(name.replace("_", "-"))
    return tools


def rel_errors(ours: np.ndarray, ref: np.ndarray) -> dict:
    diff = np.abs(ours - ref)
    return {
        "max_rel": float(diff.max() / np.abs(ref).max()),
        "rms_rel": float(np.sqrt((diff**2).sum() / (ref**2).sum())),
        "argmax_equal": int((ours.argmax(axis=1) == ref.argmax(axis=1)).sum()),
    }


def main():
    ref = json.loads((mf.REF_DIR / "llama.json").read_text())
    prompt = ref["prompt_tokens"]
    hf = np.array(ref["transformers_f32_logits"], dtype=np.float64)
    src = mf.MODEL_DIR / "llama-f32.gguf"
    out = {
        "family": "llama",
        "source": "tests/reference/make_iq4.py: llama-f32.gguf quantized by llama_model_quantize, no imatrix",
        "prompt_tokens": prompt,
        "types": {},
    }
    for ty, ftype in FTYPES.items():
        dst = mf.MODEL_DIR / f"llama-{ty}.gguf"
        mf.quantize(src, dst, ftype)
        logits = mf.llamacpp_logits(dst, prompt)
        errors = rel_errors(logits, hf)
        mf.log(f"{dst.name}: {mf.type_histogram(dst)} {errors}")
        out["types"][ty] = {
            "ftype": ftype,
            "size_bytes": dst.stat().st_size,
            "tensor_types": mf.tensor_types(dst),
            "llamacpp_logits": mf.round_rows(logits),
            "llamacpp_error_vs_transformers": errors,
        }
    out["tools"] = tool_versions()
    path = mf.REF_DIR / "llama-iq4.json"
    path.write_text(json.dumps(out) + "\n")
    mf.log(f"wrote {path}")


if __name__ == "__main__":
    main()
