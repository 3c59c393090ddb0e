#!/usr/bin/env bash
# The release of one tag vX.Y.Z: the operator and runtime images built, pushed, signed (cosign keyless) with
# an SBOM and provenance attached, and the Helm chart packaged, pushed to an OCI registry and signed.
# .github/workflows/release.yaml runs it, one step per job; run locally with --dry-run (`make release-dry-run`).
#
#   hack/release.sh [--dry-run [--build]] [--tag vX.Y.Z] [--out DIR] [STEP...]
#
# Steps, in this order when none is named:
#   verify    the tag against the chart's and the packages' versions (below); helm lint --strict; helm package into DIR;
#             helm template of the packaged chart, whose images must be the released tags
#   operator  docker buildx: linux/amd64 + linux/arm64, pushed with SBOM and provenance attestations; cosign sign
#   runtime   the same for the runtime image, linux/amd64 only (see image_platforms)
#   chart     verify, then helm push to oci://ghcr.io/chatfleet/charts and cosign sign the chart's digest
# and, only when named (the kubectl plugin for krew; one runner per platform builds its archive):
#   github-release  the tag's GitHub release, created as a draft unless it exists (it holds the plugin's files)
#   plugin-archive  kubectl-chatbot for this machine's OS and arch: one executable (PyInstaller, in a clean venv
#             holding contract/ and operator/ only) packed with LICENSE into
#             DIR/kubectl-chatbot_X.Y.Z_<os>_<arch>.tar.gz, its checksum in that name + .sha256; both uploaded
#             to the release
#   krew-manifest   plugins/chatbot.yaml (the krew manifest's template) filled in with the tag and each
#             archive's sha256 (downloaded from the release) into DIR/chatbot.yaml, uploaded to the release
#
# Versions: one version for all. The tag vX.Y.Z must equal Chart.yaml `version` and `appVersion` and the
# [project] version of each package's pyproject.toml (contract/, operator/, picker/, runtime/, hack/; a SemVer
# pre-release X.Y.Z-rc.N may be spelt X.Y.ZrcN there, PEP 440);
# the script never edits them: a tag that disagrees fails, naming each field.
#
# --dry-run  does for real every step that needs no registry and no credentials (the checks, lint, package,
#            render, the plugin's archive) and prints the build, push, sign and upload commands instead of
#            running them; the krew manifest gets zeros for the sha256 of each archive not built here. With --build the
#            images are built too (docker buildx, output to the build cache only: nothing is pushed).
# --tag      default: $RELEASE_TAG, else (dry run only) v<operator/pyproject.toml version>. A real release needs the tag
#            to exist and to name the checked-out commit, in a clean work tree.
# --out      where the packaged chart, the rendered manifests and the image digests go (default dist/release).
# Environment: RELEASE_TAG, RELEASE_DRY_RUN=1 (as --dry-run), HELM (the helm binary; default the one
# `make platform-build` builds), TRITON_IMAGE (the runtime's base image, required to build it; the workflow
# passes it), GITHUB_STEP_SUMMARY (digests are appended there when set); PYTHON (plugin-archive: the Python
# 3.11-3.13, with its shared libpython, that builds the executable; default the first of python3.13, python3.12,
# python3.11, python3 that is one), PLUGIN_PLATFORM (plugin-archive: the os_arch the runner must be), GH_TOKEN
# and GH_REPO (gh's, on a real release).
# Needs: bash, git, python3 >= 3.11 (tomllib), helm (verify, chart); docker buildx and cosign (images, chart);
# the Python package registry (plugin-archive); gh (github-release, plugin-archive, krew-manifest).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

CHART_DIR=charts/chatfleet-operator
CHART_NAME=chatfleet-operator
CHART_REPO=oci://ghcr.io/chatfleet/charts

say() { printf '[release] %s\n' "$*" >&2; }
die() { printf '[release] error: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

dry_run=${RELEASE_DRY_RUN:-}
[ "$dry_run" = 0 ] && dry_run=""
build=""
tag=${RELEASE_TAG:-}
out=dist/release
steps=()
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry_run=1 ;;
    --build) build=1 ;;
    --tag) [ $# -ge 2 ] || die "--tag needs a value (vX.Y.Z)"; tag=$2; shift ;;
    --tag=*) tag=${1#--tag=} ;;
    --out) [ $# -ge 2 ] || die "--out needs a folder"; out=$2; shift ;;
    --out=*) out=${1#--out=} ;;
    -h|--help) usage; exit 0 ;;
    verify|operator|runtime|chart|github-release|plugin-archive|krew-manifest) steps+=("$1") ;;
    *) die "unknown argument '$1' (steps: verify, operator, runtime, chart, github-release, plugin-archive, krew-manifest; hack/release.sh --help)" ;;
  esac
  shift
done
[ ${#steps[@]} -gt 0 ] || steps=(verify operator runtime chart)
[ -z "$build" ] || [ -n "$dry_run" ] || die "--build is for --dry-run (a real release always builds)"
mkdir -p "$out"
out=$(cd "$out" && pwd)

# A command as one line a shell reads back (words with other characters than these in single quotes).
show() {
  local w line=$1
  shift
  for w in "$@"; do
    if [[ $w =~ ^[A-Za-z0-9_./:=@,+%-]+$ ]]; then line+=" $w"; else line+=" '${w//\'/\'\\\'\'}'"; fi
  done
  printf '%s\n' "$line"
}
# Print a command instead of running it in a dry run.
run() {
  if [ -n "$dry_run" ]; then
    show '[release] would run:' "$@"
  else
    show '[release] +' "$@"
    "$@"
  fi
}

# --- versions ---------------------------------------------------------------------------------------------

# The Python packages, each a distribution of its own with its own pyproject.toml; they share one version.
PACKAGES=(contract operator picker runtime hack)
pyproject_version() {
  python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
    "$1/pyproject.toml"
}
# a top-level key of Chart.yaml (quotes and a trailing comment dropped)
chart_field() {
  sed -n -E "s/^$1:[[:space:]]*\"?([^\"#[:space:]]*)\"?.*/\1/p" "$CHART_DIR/Chart.yaml" | head -1
}
# X.Y.Z-rc.N -> X.Y.ZrcN (alpha -> a, beta -> b): how PEP 440 spells a SemVer pre-release
pep440() {
  if [[ $1 =~ ^([0-9]+\.[0-9]+\.[0-9]+)-(alpha|a|beta|b|rc)\.?([0-9]+)$ ]]; then
    local pre=${BASH_REMATCH[2]}
    case $pre in alpha) pre=a ;; beta) pre=b ;; esac
    printf '%s%s%s' "${BASH_REMATCH[1]}" "$pre" "${BASH_REMATCH[3]}"
  else
    printf '%s' "$1"
  fi
}

project=$(pyproject_version operator) \
  || die "cannot read [project] version from operator/pyproject.toml (python3 >= 3.11 needed)"
if [ -z "$tag" ]; then
  [ -n "$dry_run" ] || die "a release needs its tag: --tag vX.Y.Z (or RELEASE_TAG)"
  tag=v$project
  say "no tag given: dry run of v$project (operator/pyproject.toml's version)"
fi
semver='^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$'
[[ $tag =~ $semver ]] || die "tag '$tag' is not vMAJOR.MINOR.PATCH[-PRERELEASE] (SemVer; no +build: OCI tags cannot hold '+')"
version=${tag#v}

check_versions() {
  local bad=() chart_version app_version
  chart_version=$(chart_field version)
  app_version=$(chart_field appVersion)
  [ "$chart_version" = "$version" ] || bad+=("$CHART_DIR/Chart.yaml version is '$chart_version'")
  [ "$app_version" = "$version" ] || bad+=("$CHART_DIR/Chart.yaml appVersion is '$app_version'")
  local pkg pkg_version
  for pkg in "${PACKAGES[@]}"; do
    pkg_version=$(pyproject_version "$pkg") || die "cannot read [project] version from $pkg/pyproject.toml"
    [ "$pkg_version" = "$version" ] || [ "$pkg_version" = "$(pep440 "$version")" ] \
      || bad+=("$pkg/pyproject.toml [project] version is '$pkg_version'")
  done
  if [ ${#bad[@]} -gt 0 ]; then
    local b
    for b in "${bad[@]}"; do say "error: tag $tag says version $version, but $b"; done
    die "the tag disagrees with ${#bad[@]} version field(s): set them all to $version (docs/chart.md \"Release flow\")"
  fi
  say "tag $tag = Chart.yaml version = appVersion = the packages' pyproject.toml version"
  if [ -z "$dry_run" ]; then
    local at head
    at=$(git rev-parse -q --verify "refs/tags/$tag^{commit}") || die "tag $tag is not in this checkout: a release publishes a tag"
    head=$(git rev-parse HEAD)
    [ "$at" = "$head" ] || die "tag $tag names $at, but the checkout is at $head"
    [ -z "$(git status --porcelain)" ] || die "the work tree has changes: a release publishes the tag's tree"
  fi
}

# --- images -----------------------------------------------------------------------------------------------

# The image repositories are the chart's: image.repository in values.yaml, the runtime's in the template.
operator_repo() {
  awk '/^image:/ { in_image = 1; next } /^[^ #]/ { in_image = 0 }
       in_image && $1 == "repository:" { print $2; exit }' "$CHART_DIR/values.yaml"
}
runtime_repo() {
  sed -n -E 's/.*printf "([^"%]+):%s" \.Chart\.AppVersion.*/\1/p' "$CHART_DIR/templates/deployment.yaml" | head -1
}
image_repo() { case $1 in operator) operator_repo ;; runtime) runtime_repo ;; esac; }

# The operator's base (python:3.12-slim-bookworm) and every wheel of its dependencies (operator/ and
# picker/pyproject.toml) exist for amd64 and arm64, so one manifest list serves both (arm64 built under QEMU
# in CI: pure wheel installs, minutes). The runtime is amd64 only: its base is NVIDIA's Triton image and its
# ~6 GB of CUDA wheels (torch, nvidia-*) are the amd64 builds it is tested with; an arm64 (Grace) runtime
# would need its own base, wheels and test pass, and building it under QEMU would take hours.
image_platforms() { case $1 in operator) echo linux/amd64,linux/arm64 ;; runtime) echo linux/amd64 ;; esac; }

summary() { if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then printf '%s\n' "$*" >> "$GITHUB_STEP_SUMMARY"; fi; }

release_image() {
  local name=$1 repo platforms revision ref meta digest
  repo=$(image_repo "$name")
  [ -n "$repo" ] || die "cannot find the $name image's repository in $CHART_DIR"
  platforms=$(image_platforms "$name")
  revision=$(git rev-parse HEAD)
  ref=$repo:$version
  meta=$out/$name.metadata.json
  local args=(--file "$name/Dockerfile" --platform "$platforms" --build-arg "VERSION=$version"
    --build-arg "REVISION=$revision" --label "org.opencontainers.image.version=$version"
    --label "org.opencontainers.image.revision=$revision"
    --label "org.opencontainers.image.source=https://github.com/chatfleet/chatfleet")
  if [ "$name" = runtime ]; then
    # runtime/Dockerfile names no registry for its Triton base: the caller says where it comes from
    if [ -z "${TRITON_IMAGE:-}" ] && { [ -z "$dry_run" ] || [ -n "$build" ]; }; then
      die "TRITON_IMAGE is not set: the runtime's base image (<registry>/nvidia/tritonserver:25.01-py3)"
    fi
    args+=(--build-arg "TRITON_IMAGE=${TRITON_IMAGE:-<the Triton base image: TRITON_IMAGE>}")
  fi
  say "$name: $ref for $platforms"
  if [ -n "$dry_run" ] && [ -n "$build" ]; then
    # a real build, kept in the build cache: nothing leaves the machine
    dry_run="" run docker buildx build "${args[@]}" --output type=cacheonly .
  fi
  # The SBOM (SPDX, BuildKit's syft scanner) and the SLSA provenance are attestation manifests in the pushed
  # image index; signing the index's digest covers them too.
  run docker buildx build "${args[@]}" --tag "$ref" --sbom=true --provenance=mode=max \
    --metadata-file "$meta" --push .
  if [ -n "$dry_run" ]; then
    run cosign sign --yes "$repo@<the pushed digest: $meta containerimage.digest>"
    return
  fi
  digest=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["containerimage.digest"])' "$meta") \
    || die "no containerimage.digest in $meta"
  [[ $digest =~ ^sha256:[0-9a-f]{64}$ ]] || die "unexpected digest '$digest' in $meta"
  run cosign sign --yes "$repo@$digest"
  printf '%s@%s\n' "$repo" "$digest" > "$out/$name.digest"
  say "$name: $repo@$digest (tag $version) signed"
  summary "- image \`$repo:$version\`: \`$digest\` (signed; SBOM and provenance attached)"
}

# --- chart ------------------------------------------------------------------------------------------------

find_helm() {
  if [ -n "${HELM:-}" ]; then printf '%s' "$HELM"; return; fi
  # shellcheck source=versions.env
  local v; v=$(. hack/versions.env && printf '%s' "$HELM_VERSION")
  local built=${CHATFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/chatfleet}/bin/helm-$v/helm
  if [ -x "$built" ]; then printf '%s' "$built"; return; fi
  command -v helm || die "helm is missing ($built): run \`make platform-build\` (or bash hack/build-platform.sh helm)"
}

packaged=""
verify_chart() {
  local helm tgz rendered shown field want got
  helm=$(find_helm)
  say "helm lint --strict $CHART_DIR"
  "$helm" lint --strict "$CHART_DIR" >&2
  tgz=$out/$CHART_NAME-$version.tgz
  rm -f "$tgz"
  "$helm" package "$CHART_DIR" --destination "$out" >&2
  [ -f "$tgz" ] || die "helm package did not write $tgz"
  shown=$("$helm" show chart "$tgz")
  for field in version appVersion; do
    grep -qxE "$field: \"?${version//./\\.}\"?" <<< "$shown" \
      || die "the packaged chart's Chart.yaml has no '$field: $version'"
  done
  rendered=$out/$CHART_NAME-$version.yaml
  "$helm" template cf "$tgz" --namespace chatfleet-system > "$rendered"
  want="$(operator_repo):$version"
  got=$(sed -n -E 's/^[[:space:]]+image: "?([^"]+)"?$/\1/p' "$rendered" | sort -u)
  [ "$got" = "$want" ] || die "the packaged chart renders the operator image '$got', not '$want'"
  want="$(runtime_repo):$version"
  got=$(sed -n -E 's/.*"--runtime-image=([^"]+)".*/\1/p' "$rendered")
  [ "$got" = "$want" ] || die "the packaged chart renders the runtime image '$got', not '$want'"
  say "packaged $tgz (version $version, appVersion $version); renders $(operator_repo):$version and $want"
  packaged=$tgz
}

release_chart() {
  [ -n "$packaged" ] || verify_chart
  local helm registry pushed digest
  helm=$(find_helm)
  registry=${CHART_REPO#oci://}
  if [ -n "$dry_run" ]; then
    run "$helm" push "$packaged" "$CHART_REPO"
    run cosign sign --yes "$registry/$CHART_NAME@<the digest helm push prints>"
    return
  fi
  pushed=$(run "$helm" push "$packaged" "$CHART_REPO" 2>&1) || { printf '%s\n' "$pushed" >&2; die "helm push failed"; }
  printf '%s\n' "$pushed" >&2
  digest=$(sed -n -E 's/^Digest: (sha256:[0-9a-f]{64})$/\1/p' <<< "$pushed" | head -1)
  [ -n "$digest" ] || die "helm push printed no digest"
  run cosign sign --yes "$registry/$CHART_NAME@$digest"
  printf '%s/%s@%s\n' "$registry" "$CHART_NAME" "$digest" > "$out/chart.digest"
  say "chart: $CHART_REPO/$CHART_NAME:$version = $digest signed"
  summary "- chart \`$CHART_REPO/$CHART_NAME\` $version: \`$digest\` (signed)"
}

# --- the kubectl plugin, for krew ----------------------------------------------------------------------------

KREW_TEMPLATE=plugins/chatbot.yaml
# The platforms of the plugin's archives, as krew names them (os_arch): each is built on a runner of its own
# (.github/workflows/release.yaml, job plugin), since the executable carries that platform's Python and wheels.
PLUGIN_PLATFORMS=(linux_amd64 linux_arm64 darwin_amd64 darwin_arm64)

plugin_platform() {
  local os arch
  case $(uname -s) in
    Linux) os=linux ;; Darwin) os=darwin ;;
    *) die "kubectl-chatbot archives are built on Linux and macOS, not on $(uname -s)" ;;
  esac
  case $(uname -m) in
    x86_64|amd64) arch=amd64 ;; aarch64|arm64) arch=arm64 ;;
    *) die "kubectl-chatbot archives are built for amd64 and arm64, not for $(uname -m)" ;;
  esac
  printf '%s_%s' "$os" "$arch"
}
plugin_archive_name() { printf 'kubectl-chatbot_%s_%s.tar.gz' "$version" "$1"; }
sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -d' ' -f1; else shasum -a 256 "$1" | cut -d' ' -f1; fi
}
pinned() { (. hack/versions.env && printf '%s' "${!1}"); }

# A Python that operator/pyproject.toml allows (>= 3.11, < 3.14): $PYTHON, else the first on PATH.
plugin_python() {
  local c
  for c in ${PYTHON:-python3.13 python3.12 python3.11 python3}; do
    if "$c" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 14))' >/dev/null 2>&1; then
      command -v "$c"
      return
    fi
  done
  die "no Python 3.11-3.13 to build kubectl-chatbot with (${PYTHON:-python3.13, python3.12, python3.11, python3}): set PYTHON"
}

# The tag's GitHub release holds the plugin's archives and its krew manifest. One job creates it before the
# platforms' jobs upload into it (drafts do not claim their tag: two creators racing would make two); a
# draft, published by hand with the notes (docs/chart.md "Release flow").
github_release() {
  if [ -z "$dry_run" ] && gh release view "$tag" >/dev/null 2>&1; then
    say "GitHub release $tag exists"
    return
  fi
  run gh release create "$tag" --verify-tag --draft --title "$tag" \
    --notes "Chatfleet $tag: the images, the chart and kubectl-chatbot (docs/chart.md \"Release flow\")."
}

# kubectl-chatbot as one executable: PyInstaller's bootloader, this platform's Python and the plugin's
# imports (the kubernetes client, pydantic's native core, PyYAML), unpacked to a temporary folder at each
# start. Built from copies of contract/ and operator/, installed into a venv of their own, so nothing of a
# development install rides along and the work tree stays clean.
plugin_work=""
trap '[ -z "$plugin_work" ] || rm -rf "$plugin_work"' EXIT
plugin_archive() {
  local platform name py work pyinstaller hooks
  platform=$(plugin_platform)
  [ -z "${PLUGIN_PLATFORM:-}" ] || [ "$PLUGIN_PLATFORM" = "$platform" ] \
    || die "this machine is $platform, not $PLUGIN_PLATFORM (PLUGIN_PLATFORM)"
  name=$(plugin_archive_name "$platform")
  py=$(plugin_python)
  pyinstaller=$(pinned PYINSTALLER_VERSION)
  hooks=$(pinned PYINSTALLER_HOOKS_CONTRIB_VERSION)
  work=$(mktemp -d)
  plugin_work=$work
  say "kubectl-chatbot for $platform: PyInstaller $pyinstaller, $("$py" -V 2>&1) ($py)"
  mkdir -p "$work/src"
  cp -R contract operator "$work/src/"
  rm -rf "$work"/src/*/build "$work"/src/*/*.egg-info
  "$py" -m venv "$work/venv"
  "$work/venv/bin/python" -m pip install -q --disable-pip-version-check "$work/src/contract" "$work/src/operator" \
    "pyinstaller==$pyinstaller" "pyinstaller-hooks-contrib==$hooks" \
    || die "pip could not install contract/, operator/ and PyInstaller $pyinstaller (is the Python package registry reachable?)"
  printf 'import sys\n\nfrom chatfleet_operator.plugin import main\n\nsys.exit(main())\n' > "$work/kubectl-chatbot.py"
  "$work/venv/bin/pyinstaller" --onefile --noconfirm --clean --log-level WARN --name kubectl-chatbot \
    --distpath "$work/stage" --workpath "$work/build" --specpath "$work/build" "$work/kubectl-chatbot.py" >&2 \
    || die "PyInstaller $pyinstaller could not build kubectl-chatbot"
  cp LICENSE "$work/stage/LICENSE"
  chmod 0755 "$work/stage/kubectl-chatbot"
  chmod 0644 "$work/stage/LICENSE"
  # it runs with no Python and no venv around it
  env -i HOME="$work" PATH=/usr/bin:/bin "$work/stage/kubectl-chatbot" --help >/dev/null \
    || die "the built kubectl-chatbot does not run: $work/stage/kubectl-chatbot --help"
  # COPYFILE_DISABLE: macOS's tar adds no ._ metadata files
  COPYFILE_DISABLE=1 tar -czf "$out/$name" -C "$work/stage" kubectl-chatbot LICENSE
  printf '%s  %s\n' "$(sha256_of "$out/$name")" "$name" > "$out/$name.sha256"
  say "$out/$name ($(( $(wc -c < "$out/$name") / 1024 / 1024 )) MiB), sha256 $(cut -d' ' -f1 "$out/$name.sha256")"
  run gh release upload "$tag" "$out/$name" "$out/$name.sha256" --clobber
  summary "- kubectl-chatbot \`$name\`: sha256 \`$(cut -d' ' -f1 "$out/$name.sha256")\`"
}

# plugins/chatbot.yaml with {{TAG}}, {{VERSION}} and {{SHA256 <os_arch>}} filled in: the manifest that
# `kubectl krew install --manifest-url=<the release's chatbot.yaml>` reads.
krew_manifest() {
  local p file sha missing=() rendered=$out/chatbot.yaml
  local fill=(-e "s/{{TAG}}/$tag/g" -e "s/{{VERSION}}/$version/g")
  # the archives' checksums, each uploaded by its platform's job
  [ -n "$dry_run" ] || run gh release download "$tag" --pattern 'kubectl-chatbot_*.sha256' --dir "$out" --clobber
  for p in "${PLUGIN_PLATFORMS[@]}"; do
    grep -qF "{{SHA256 $p}}" "$KREW_TEMPLATE" || die "$KREW_TEMPLATE has no platform $p ({{SHA256 $p}})"
    file=$out/$(plugin_archive_name "$p").sha256
    if [ -f "$file" ]; then
      sha=$(cut -d' ' -f1 "$file")
    elif [ -n "$dry_run" ]; then
      sha=0000000000000000000000000000000000000000000000000000000000000000
      missing+=("$p")
    else
      die "no $file: the release $tag has no kubectl-chatbot archive for $p"
    fi
    [[ $sha =~ ^[0-9a-f]{64}$ ]] || die "$file holds no sha256: '$sha'"
    fill+=(-e "s/{{SHA256 $p}}/$sha/g")
  done
  # the template's opening comment (how to fill it) gives way to one line saying where this one comes from
  {
    printf '# kubectl chatbot %s for krew, rendered from %s by hack/release.sh krew-manifest\n' "$tag" "$KREW_TEMPLATE"
    sed -n '/^[^#]/,$p' "$KREW_TEMPLATE" | sed "${fill[@]}"
  } > "$rendered"
  if grep -q '{{' "$rendered"; then
    die "$KREW_TEMPLATE has placeholders the release does not fill: $(grep -o '{{[^}]*}}' "$rendered" | sort -u | tr '\n' ' ')"
  fi
  [ ${#missing[@]} -eq 0 ] || say "dry run: no archive here for ${missing[*]}: their sha256 in $rendered is zeros"
  say "krew manifest $rendered ($tag)"
  run gh release upload "$tag" "$rendered" --clobber
  summary "- krew manifest \`chatbot.yaml\`: \`kubectl krew install --manifest-url=https://github.com/chatfleet/chatfleet/releases/download/$tag/chatbot.yaml\`"
}

# --- main -------------------------------------------------------------------------------------------------

say "$tag${dry_run:+ (dry run: nothing is pushed or signed)}; output in $out"
check_versions
for step in "${steps[@]}"; do
  case $step in
    verify) verify_chart ;;
    operator|runtime) release_image "$step" ;;
    chart) release_chart ;;
    github-release) github_release ;;
    plugin-archive) plugin_archive ;;
    krew-manifest) krew_manifest ;;
  esac
done
printf '%s\n' "$version" > "$out/version"
say "done: $tag${dry_run:+ (dry run)}"
