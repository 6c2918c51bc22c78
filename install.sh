#!/usr/bin/env bash
# Install everything coordl and its tests need on a fresh Debian machine:
# system packages, a virtual environment in .venv with exactly the versions of
# requirements/lock-py<python>.txt (torch 2.13.0 as pip's index serves it, NVIDIA DALI, the test
# tools), pillow-simd built from source with AVX2, and coordl itself in editable mode.
# Safe to run again: a second run changes nothing. `bash install.sh --lock` refreshes the lock.
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

PY=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
LOCK=requirements/lock-py$PY.txt
EXTRAS='dev,redis,dali,integrations,ray'

if [ "${1:-}" = "--lock" ]; then
  # Refresh the lock: a fresh venv, the newest releases setup.cfg's ranges allow, frozen.
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  python3 -m venv "$tmp/venv"
  "$tmp/venv/bin/python" -m pip install -q --upgrade pip setuptools wheel
  "$tmp/venv/bin/python" -m pip install -q torch==2.13.0
  "$tmp/venv/bin/python" -m pip install -q ".[$EXTRAS]"
  "$tmp/venv/bin/python" -m pip uninstall -q -y coordl
  pillow=$("$tmp/venv/bin/python" -c 'import PIL; print(PIL.__version__)')
  simd=$(grep -i '^pillow-simd==' "$LOCK" 2>/dev/null || echo 'pillow-simd==12.1.1.post0')
  { sed -n '1,/^# A user/p' "$LOCK" 2>/dev/null
    "$tmp/venv/bin/python" -m pip freeze --all 2>/dev/null \
      | grep -viE '^(pillow|pillow-simd)==' | sed -E 's/^(torch==[0-9.]+)\+[a-z0-9]+$/\1/'
    echo "$simd"; echo "Pillow==$pillow"; } > "$tmp/lock"
  mkdir -p requirements && mv "$tmp/lock" "$LOCK"
  echo "[install] wrote $LOCK ($(grep -c '==' "$LOCK") pins); run bash install.sh, then the tests"
  exit 0
fi
[ -f "$LOCK" ] || { echo "[install] no $LOCK for Python $PY: run 'bash install.sh --lock' to make one" >&2; exit 2; }
pin() { grep -iE "^$1==" "$LOCK" | head -1; }

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q "$(pin pip)" "$(pin setuptools)" "$(pin wheel)"
# torch first, with its own dependencies resolved (a CUDA build from PyPI brings NVIDIA's
# libraries, which the lock of this CPU build does not list), held to the lock's versions.
$PIP install -q -c <(grep -viE '^(pillow|pillow-simd)==' "$LOCK") "$(pin torch)"
# then exactly the locked set, nothing resolved: --no-deps keeps matplotlib (and anything else
# that depends on "pillow") from bringing plain Pillow back over pillow-simd on every run.
$PIP install -q --no-deps -r <(grep -viE '^(pillow|pillow-simd|torch)==' "$LOCK" | grep -v '^#')
# coordl itself, editable, with its C extensions: when it is not yet installed from this folder,
# or its metadata or a C source changed since (install.sh leaves a stamp in the venv).
stamp="$VENV/.coordl-installed-from"
if [ "$(cat "$stamp" 2>/dev/null)" != "$PWD" ] \
   || [ -n "$(find setup.cfg setup.py coordl/_version.py pipelines coordl/manifest -maxdepth 1 \
                   \( -name '*.c' -o -name 'setup.*' -o -name '_version.py' \) -newer "$stamp" 2>/dev/null)" ]; then
  $PIP install -q --no-deps -e ".[$EXTRAS]"
  echo "$PWD" > "$stamp"
fi
if ! $VENV/bin/python -c 'import PIL, sys; sys.exit(0 if ".post" in PIL.__version__ else 1)' 2>/dev/null; then
  echo "[install] building pillow-simd (about a minute)"
  $PIP uninstall -q -y pillow pillow-simd >/dev/null 2>&1 || true
  flags=""; grep -q avx2 /proc/cpuinfo && flags="-mavx2"
  CC="cc $flags" $PIP install -q --no-deps --no-binary pillow-simd "$(pin pillow-simd)" \
    || { echo "[install] pillow-simd failed to build; falling back to Pillow"; $PIP install -q --no-deps "$(pin pillow)"; }
fi
# Plain Pillow beside pillow-simd, in a side folder that only bench/loaders.py
# puts first on sys.path (its torch + plain Pillow baseline); nothing else sees it.
[ -d "$VENV/plain-pillow/PIL" ] || $PIP install -q --no-deps --target "$VENV/plain-pillow" "$(pin pillow)"
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
