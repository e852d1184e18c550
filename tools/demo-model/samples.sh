#!/bin/sh
# Prints the samples quoted in MODEL_CARD.md, produced by Bulkhead's engine
# from the committed Q8_0 file. Run from the repository root after
# `cargo build --release`.
set -eu
gpu=${GPU_HOST:-target/release/bulkhead-gpu-host}
model=models/bulkhead-demo-tiny/bulkhead-demo-tiny-q8_0.gguf
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() {
    printf '$ bulkhead-gpu-host generate --model %s' "$model"
    for a in "$@"; do printf " '%s'" "$a"; done
    echo
    "$gpu" generate --model "$model" "$@"
    echo
}

for p in "It is a truth universally acknowledged, that" "Emma was" "\"My dear Fanny,\" said Edmund,"; do
    run --prompt "$p" --max-tokens 64                                # greedy
    run --prompt "$p" --max-tokens 64 --temperature 0.8 --top-p 0.95 --seed 1
done

printf '%s' '[{"role": "user", "content": "Hello! How do you do?"}]' >"$tmp/hello.json"
printf '%s' '[{"role": "user", "content": "Do you think he will come to the ball tomorrow?"}]' >"$tmp/ball.json"
printf '%s' '[{"role": "user", "content": "Continue this passage:\n\nIt was a fine morning, and Elizabeth walked out into the garden."}]' >"$tmp/continue.json"
for c in hello ball continue; do
    echo "chat: $(cat "$tmp/$c.json")"
    run --chat "$tmp/$c.json" --max-tokens 96
    run --chat "$tmp/$c.json" --max-tokens 96 --temperature 0.8 --top-p 0.95 --seed 1
done
