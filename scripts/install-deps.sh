#!/usr/bin/env bash
# Installs every system dependency of dtr from Debian packages. Idempotent: packages already
# present are skipped, so a second run costs one dpkg query.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config
  libeigen3-dev
  openmpi-bin libopenmpi-dev
  libyaml-cpp-dev
  libcli11-dev
  catch2
  nlohmann-json3-dev
  libpcre2-dev
  libopenblas-dev
  gnuplot-nox
  python3 python3-pip python3-venv
  jq
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: error: not root and no sudo; install as root: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
