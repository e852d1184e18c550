#!/usr/bin/env bash
# Regenerates the model-signing unit-test fixtures: keys of every kind the
# key loader must take or name (written by OpenSSL, as users make them) and
# a small model folder signed by the reference tool, model_signing 1.1.1
# (`tests/e2e/requirements.txt`). TEST KEYS, public on purpose. (No `.git`
# folder in the fixture: git cannot commit one; the unit tests make their own.)
#
#   model-signing/tests/model-signing/make.sh /path/to/venv/bin/python
set -euo pipefail
python="${1:?usage: make.sh PYTHON (a venv with tests/e2e/requirements.txt)}"
cd "$(dirname "$0")"
rm -rf keys reference
mkdir -p keys reference/model/sub

k=keys
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out $k/p256.pkcs8.pem
openssl pkey -in $k/p256.pkcs8.pem -pubout -out $k/p256.pub.pem
# `openssl ecparam -genkey` writes SEC1 with an EC PARAMETERS block first.
openssl ecparam -name prime256v1 -genkey -out $k/p256.sec1.pem
openssl pkey -in $k/p256.sec1.pem -pubout -out $k/p256.sec1.pub.pem
openssl genpkey -algorithm ed25519 -out $k/ed25519.pem
openssl pkey -in $k/ed25519.pem -pubout -out $k/ed25519.pub.pem
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:1024 -out $k/rsa.pem
openssl pkey -in $k/rsa.pem -pubout -out $k/rsa.pub.pem
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-384 -out $k/p384.pkcs8.pem
openssl pkey -in $k/p384.pkcs8.pem -pubout -out $k/p384.pub.pem
openssl ecparam -name secp384r1 -genkey -noout -out $k/p384.sec1.pem
openssl pkcs8 -topk8 -in $k/p256.pkcs8.pem -passout pass:test -out $k/p256.encrypted.pem

m=reference/model
printf '{"architectures": ["LlamaForCausalLM"]}\n' > $m/config.json
printf 'tokenizer\n' > $m/sub/tokenizer.txt
printf 'hidden\n' > $m/.hidden
printf '*.tmp\n' > $m/.gitignore
"$python" -c 'import sys; sys.stdout.buffer.write(bytes(i * 7 % 251 for i in range(5000)))' > $m/weights.bin
"$python" -m model_signing sign key $m --private_key $k/p256.pkcs8.pem --signature $m/model.sig
