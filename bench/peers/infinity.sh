#!/usr/bin/env bash
# Installs the Infinity embedding server (a peer for bench.served) into its own
# virtualenv, pinned, outside the repository: it pins sentence-transformers<4
# and numpy<2, which flotilla's environment must not get.
#
#   bench/peers/infinity.sh            # install (skips when already installed)
#   bench/peers/infinity.sh --path     # print the venv's directory
#
# Location: $FLOTILLA_PEERS_DIR/infinity-0.0.78, by default
# ~/.cache/flotilla/peers/infinity-0.0.78. About 6 GB (PyPI's torch wheel
# carries CUDA). Python: $PYTHON, by default python3 (3.11: the constraints'
# versions were resolved on it).
set -euo pipefail

VERSION=0.0.78
# The versions of a working install (Python 3.11, Linux x86_64): the same
# transitive dependencies on every machine.
CONSTRAINTS="$(cd "$(dirname "$0")" && pwd)/infinity-constraints.txt"
PEERS_DIR="${FLOTILLA_PEERS_DIR:-$HOME/.cache/flotilla/peers}"
VENV="$PEERS_DIR/infinity-$VERSION"
PYTHON="${PYTHON:-python3}"

if [[ "${1:-}" == "--path" ]]; then
    echo "$VENV"
    exit 0
fi

# The marker is written last, so a half-finished install is redone.
if [[ -f "$VENV/.installed" && -x "$VENV/bin/infinity_emb" ]]; then
    echo "infinity-emb $VERSION already installed in $VENV"
    exit 0
fi

mkdir -p "$PEERS_DIR"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install -c "$CONSTRAINTS" "infinity-emb[server,torch]==$VERSION"
"$VENV/bin/infinity_emb" --help >/dev/null
"$VENV/bin/python" -m pip freeze >"$VENV/.installed"
echo "infinity-emb $VERSION installed in $VENV"
