#!/usr/bin/env bash
# Build the servers the model-URI tests start on 127.0.0.1, and the stock client the chat API is tested with,
# once, cached by version:
#   registry  the CNCF distribution registry (oci://), from the Go module proxy:
#             $CHATFLEET_CACHE/bin/registry-<version>/registry  (cold: ~3 min on 2 cores)
#   moto      moto's S3 server (s3://) in its own virtual environment (moto needs botocore, whose
#             python-dateutil<3 pin conflicts with the kubernetes client's >=3 in the project venv):
#             $CHATFLEET_CACHE/tools/moto-<version>/bin/moto_server
#   guidellm  the stock OpenAI-compatible benchmark client (tests/integration/runtime/test_runtime_stock_client.py)
#             in its own virtual environment, its unpinned dependencies kept out of the project venv. It needs
#             torch, whose only Linux x86_64 wheel in the Python package registry is the CUDA build with its
#             nvidia-* libraries: the venv is ~6 GB (cold: ~2 min here):
#             $CHATFLEET_CACHE/tools/guidellm-<version>/bin/guidellm
#   checkov   the chart's policy scan (hack/chart-checkov.sh, tests/chart/test_chart_checkov.py) in its own
#             virtual environment (it pins many packages of its own): $CHATFLEET_CACHE/tools/checkov-<version>
#             (only when asked: `make chart-tools` does)
# The GCS emulator (gs://) and the HTTPS server (http(s)://) come with the dev group (pyproject.toml).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
CACHE=${CHATFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/chatfleet}
# as in build-platform.sh: no debug information, which -s -w throws away
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS='-buildvcs=false -gcflags=all=-dwarf=false'
say() { printf '[build] %s\n' "$*" >&2; }
die() { printf '[build] error: %s\n' "$*" >&2; exit 1; }

build_registry() {
  local v=$DISTRIBUTION_VERSION out="$CACHE/bin/registry-$DISTRIBUTION_VERSION" d="$CACHE/build/registry-$DISTRIBUTION_VERSION"
  [ -x "$out/registry" ] && { say "registry v$v cached"; return; }
  command -v go >/dev/null 2>&1 || die "the Go toolchain is missing: install Go >= 1.25 (it builds the OCI registry)"
  say "building the distribution registry v$v"
  mkdir -p "$d" "$out.tmp" && cd "$d"
  printf 'module example.local/registrybin\n\ngo 1.25.0\n\nrequire github.com/distribution/distribution/v3 v%s\n\ntool github.com/distribution/distribution/v3/cmd/registry\n' "$v" > go.mod
  go mod tidy || die "cannot fetch github.com/distribution/distribution/v3@v$v from the Go module proxy"
  go build -trimpath -ldflags "-s -w" -o "$out.tmp/registry" github.com/distribution/distribution/v3/cmd/registry
  rm -rf "$out" && mv "$out.tmp" "$out"
}

# in_place VENV: the venv's scripts run from where it lies. pip writes each script's interpreter as an absolute
# path (`#!VENV/bin/python3`), so a venv whose folder was moved or copied elsewhere (a cache restored to
# another path) keeps its marker but none of its commands start: it is made again.
in_place() { case "$(head -n 1 "$1/bin/pip" 2>/dev/null)" in "#!$1/bin/python"*) return 0 ;; *) return 1 ;; esac; }

# pip_tool NAME VERSION SPEC [CHECK...]: SPEC pip-installed into its own venv $CACHE/tools/NAME-VERSION, once
# (a .complete marker, trusted while the venv lies where it was made); CHECK, when given, is a command run
# from the venv's bin/ that must succeed.
pip_tool() {
  local name=$1 v=$2 spec=$3 venv="$CACHE/tools/$1-$2"
  shift 3
  if [ -f "$venv/.complete" ]; then
    in_place "$venv" && { say "$name v$v cached"; return; }
    say "$venv was made at another path (its commands name another interpreter): making it again"
  fi
  say "installing $spec into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "$spec" || die "cannot install $spec from the Python package registry"
  if [ $# -gt 0 ]; then
    "$venv/bin/$1" "${@:2}" >/dev/null || die "$spec installed into $venv but does not start"
  fi
  touch "$venv/.complete"
}

build_checkov() { pip_tool checkov "$CHECKOV_VERSION" "checkov==$CHECKOV_VERSION" checkov --version; }

build_moto() { pip_tool moto "$MOTO_VERSION" "moto[server]==$MOTO_VERSION"; }

# guidellm's torch is the registry's CUDA build with its nvidia-* libraries (~6 GB)
build_guidellm() { pip_tool guidellm "$GUIDELLM_VERSION" "guidellm==$GUIDELLM_VERSION" guidellm --help; }

for t in ${*:-registry moto guidellm}; do
  case $t in
    registry) build_registry ;; moto) build_moto ;; guidellm) build_guidellm ;; checkov) build_checkov ;;
    *) die "unknown test server '$t' (registry, moto, guidellm)" ;;
  esac
done
