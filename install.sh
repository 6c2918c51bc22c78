#!/usr/bin/env bash
# Install everything coordl and its tests need on a fresh Debian machine:
# system packages, a virtual environment in .venv, torch 2.13.0 (as pip's index serves it),
# pillow-simd built from source with AVX2, NVIDIA DALI, and coordl itself
# in editable mode with its test tools. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${COORDL_VENV:-.venv}

if command -v apt-get >/dev/null 2>&1; then
  need=""
  for p in libjpeg62-turbo-dev zlib1g-dev redis-server; do
    dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
  done
  if [ -n "$need" ]; then
    echo "[install] apt-get install$need"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need >/dev/null
  fi
fi

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip setuptools wheel
$PIP install -q torch==2.13.0
# coordl with its extras; Pillow is replaced by pillow-simd just below, so it
# must come last: anything that depends on "pillow" would reinstall plain Pillow.
$PIP install -q -e '.[dev,redis,dali,integrations]'
if ! $VENV/bin/python -c 'import PIL, sys; sys.exit(0 if ".post" in PIL.__version__ else 1)' 2>/dev/null; then
  echo "[install] building pillow-simd (about a minute)"
  $PIP uninstall -q -y pillow pillow-simd >/dev/null 2>&1 || true
  flags=""; grep -q avx2 /proc/cpuinfo && flags="-mavx2"
  CC="cc $flags" $PIP install -q --no-binary pillow-simd pillow-simd \
    || { echo "[install] pillow-simd failed to build; falling back to Pillow"; $PIP install -q pillow; }
fi
# Plain Pillow beside pillow-simd, in a side folder that only bench/loaders.py
# puts first on sys.path (its torch + plain Pillow baseline); nothing else sees it.
[ -d "$VENV/plain-pillow/PIL" ] || $PIP install -q --target "$VENV/plain-pillow" Pillow
# Azurite, the Azure Storage emulator the az:// tests start (tests/objservers.py): npm, into the venv.
AZURITE_VERSION=3.35.0
if grep -qs "\"version\": \"$AZURITE_VERSION\"" "$VENV/azurite/node_modules/azurite/package.json"; then
  :
elif command -v npm >/dev/null 2>&1; then
  echo "[install] npm install azurite@$AZURITE_VERSION into $VENV/azurite"
  npm install -s --no-audit --no-fund --prefix "$VENV/azurite" "azurite@$AZURITE_VERSION" >/dev/null
else
  echo "[install] npm not found: Azurite not installed, the az:// tests (tests/objstore/test_gcs_azure.py) will skip"
fi
$VENV/bin/coordl info
