#!/usr/bin/env bash
# .ci/prepare.sh: what `make test` runs first. It checks the toolchains
# (Go at least go.mod's version, a C compiler for -race, Node.js >= 20 with
# npm) and the Debian packages of .ci/packages. Missing packages are
# installed with apt-get when run as root on Debian; otherwise it prints
# the one apt-get line they need and exits 1 before anything runs. A
# missing toolchain is reported with how to get it (exit 1): Debian 12's
# own golang and nodejs packages are too old.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
NODE=${NODE:-node}

problems=()

# Go, at least the version go.mod names (GOTOOLCHAIN=local: the version of
# this go command itself, not one it would download).
want_go=$(sed -n 's/^go \([0-9][0-9.]*\)$/\1/p' go.mod)
if ! command -v "$GO" >/dev/null 2>&1; then
  problems+=("Go $want_go or newer is missing: unpack the release from https://go.dev/dl into /usr/local/go and put /usr/local/go/bin on PATH")
else
  have_go=$(GOTOOLCHAIN=local "$GO" env GOVERSION | sed 's/^go//')
  if [ "$(printf '%s\n%s\n' "$want_go" "$have_go" | sort -V | head -n1)" != "$want_go" ]; then
    problems+=("Go $want_go or newer is needed (go.mod), $GO is $have_go: install it from https://go.dev/dl")
  fi
fi

# Node.js >= 20 and npm (the Node.js client; clients/node/package.json).
if ! command -v "$NODE" >/dev/null 2>&1; then
  problems+=("Node.js 20 or newer is missing (Debian 12's nodejs is 18): install Node.js 20 or newer, with npm, e.g. NodeSource's nodejs package")
else
  node_major=$("$NODE" --version | sed 's/^v\([0-9]*\).*/\1/')
  if [ "$node_major" -lt 20 ]; then
    problems+=("Node.js 20 or newer is needed, $NODE is $("$NODE" --version) (Debian 12's nodejs is 18): install Node.js 20, with npm, e.g. NodeSource's nodejs package")
  elif ! command -v npm >/dev/null 2>&1; then
    problems+=("npm is missing beside Node.js $("$NODE" --version): install the npm that comes with your Node.js")
  fi
fi

# The packages.
missing=()
while read -r pkg kind what _; do
  case $pkg in ''|'#'*) continue ;; esac
  case $kind in
  command) command -v "$what" >/dev/null 2>&1 || missing+=("$pkg") ;;
  file) [ -e "$what" ] || missing+=("$pkg") ;;
  glob) compgen -G "$what" >/dev/null || missing+=("$pkg") ;;
  python) /usr/bin/python3 -c "import $what" 2>/dev/null || missing+=("$pkg") ;;
  *) echo "prepare.sh: .ci/packages: unknown check $kind for $pkg" >&2; exit 2 ;;
  esac
done < .ci/packages

if [ ${#missing[@]} -gt 0 ]; then
  # Installed only when nothing else is in the way (a toolchain to fetch by
  # hand first is reported together with the packages).
  if [ ${#problems[@]} -eq 0 ] && [ "$(id -u)" -eq 0 ] && [ -f /etc/debian_version ] && command -v apt-get >/dev/null 2>&1; then
    echo "prepare.sh: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
      echo "prepare.sh: apt-get install ${missing[*]} failed" >&2
      exit 1
    fi
  else
    problems+=("missing packages; run as root: apt-get install -y --no-install-recommends ${missing[*]}")
  fi
fi

# A C compiler for -race (cgo), checked after the install.
if [ ${#problems[@]} -eq 0 ]; then
  cc=$("$GO" env CC)
  command -v "$cc" >/dev/null 2>&1 || problems+=("no C compiler ($cc) for go test -race: apt-get install gcc libc6-dev")
fi

if [ ${#problems[@]} -gt 0 ]; then
  echo "make test cannot run on this machine yet:" >&2
  for p in "${problems[@]}"; do echo "  - $p" >&2; done
  exit 1
fi
