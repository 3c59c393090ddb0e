#!/usr/bin/env bash
# The virtual environment kept between checkouts, so that a fresh clone (CI's, a second work tree) does not
# install its ~6 GB of wheels again (about 200 s on 2 cores, from pip's cache).
#
#   hack/venv-cache.sh restore VENV PYPROJECT...   VENV absent: made from the kept venv of this key, ready to
#                                                  use; exit 1 when none is kept (the caller then installs)
#   hack/venv-cache.sh save VENV PYPROJECT...      keep VENV under this key (after a complete install)
# Both run in the repository's root (the Makefile's): its editable installs are of that clone.
#
# The key: a hash of the pyproject.toml files (every pin), the Python that makes the venv and the machine.
# Kept under $CHATFLEET_CACHE/venvs/<key>/ (default ~/.cache/chatfleet), the two newest keys only.
#
# Both copies are hard links to the same files, so keeping one costs no disk while its venv exists, and a
# restore takes seconds. Neither can change the other: pip and Python replace files (a new file renamed
# over the old, or the old one removed), never write into one; the only files that name the venv's own
# path (its scripts' #! lines, pyvenv.cfg) or the clone it was made in (the editable installs of this
# repository's packages: setuptools' finder modules, their .pth files, direct_url.json) are written anew by
# the restore, naming this venv and this clone. A restore then checks that every editable package is found
# in this clone, and gives up (exit 1: the caller installs as before) if one is not. The pins are the key,
# so a restored venv holds what pip would install. Where the cache and the clone are on different file
# systems (no hard links) nothing is kept, and every clone installs as before.
set -euo pipefail

die() { printf '[venv-cache] error: %s\n' "$*" >&2; exit 2; }
say() { printf '[venv-cache] %s\n' "$*" >&2; }

[ $# -ge 3 ] || die "usage: hack/venv-cache.sh restore|save VENV PYPROJECT..."
action=$1 venv=$2
shift 2
cache=${CHATFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/chatfleet}/venvs
py=${VENV_PYTHON:-python3}
key=$({ cat "$@"; "$py" -VV; uname -m; } | sha1sum | cut -c1-16)
kept=$cache/$key
origin_file=$kept.origin
# a path as the venv's files spell it (absolute, without .. or a trailing slash)
absolute() { realpath -m "$1"; }
# a path as a sed pattern matches it literally (the delimiter is #)
literal() { printf '%s' "$1" | sed 's/[][\.*^$#]/\\&/g'; }

case $action in
  restore)
    [ ! -e "$venv" ] || die "$venv exists: restore makes a venv only where there is none"
    [ -d "$kept" ] && [ -f "$origin_file" ] || { say "no venv kept for key $key"; exit 1; }
    { read -r origin; read -r origin_root; } < "$origin_file" || true
    target=$(absolute "$venv")
    root=$(pwd -P)
    started=$(date +%s)
    tmp=$target.restoring
    rm -rf "$tmp"
    mkdir -p "$(dirname "$target")"
    cp -al "$kept" "$tmp" 2>/dev/null || { rm -rf "$tmp"; say "cannot hard-link $kept to $tmp (another file system?)"; exit 1; }
    rm -f "$tmp"/.installed-*
    # sed -i writes a new file and renames it over the link: the kept copy keeps its own
    if [ "$origin" != "$target" ]; then
      { grep -rlIZ -F "$origin" "$tmp/bin" "$tmp/pyvenv.cfg" || true; } | xargs -0 -r sed -i "s#$(literal "$origin")#${target}#g"
    fi
    site=$(echo "$tmp"/lib/python*/site-packages)
    if [ -n "${origin_root:-}" ] && [ "$origin_root" != "$root" ]; then
      { grep -lIZ -F "$origin_root/" "$site"/__editable__* "$site"/*.pth "$site"/*.dist-info/direct_url.json \
          2>/dev/null || true; } | xargs -0 -r sed -i "s#$(literal "$origin_root")/#${root}/#g"
      rm -f "$site"/__pycache__/__editable__*
    fi
    if ! "$tmp/bin/python" - "$root" "$site" <<'EOF'
import ast, glob, os, re, sys
root, site = sys.argv[1], sys.argv[2]
wrong = []
for finder in glob.glob(os.path.join(site, "__editable___*_finder.py")):
    found = re.search(r"^MAPPING\b[^=]*=\s*(\{.*\})\s*$", open(finder).read(), re.M)
    for name, path in (ast.literal_eval(found.group(1)) if found else {}).items():
        if not path.startswith(root + os.sep) or not os.path.isdir(path):
            wrong.append(f"{name} -> {path}")
if wrong:
    sys.exit("editable packages not found in this clone: " + ", ".join(wrong))
EOF
    then
      rm -rf "$tmp" "$kept" "$origin_file"  # the next save keeps one that fits
      say "the venv kept as $key does not fit this clone: dropped; a new one is made"
      exit 1
    fi
    mv -T "$tmp" "$target"
    touch "$kept"  # recently used: kept longest
    say "$venv from the venv kept as $key in $(( $(date +%s) - started )) s"
    ;;
  save)
    [ -x "$venv/bin/python" ] || die "$venv has no bin/python: nothing to keep"
    [ ! -d "$kept" ] || exit 0
    mkdir -p "$cache"
    tmp=$(mktemp -d "$cache/.saving.XXXXXX")
    if ! cp -al "$venv" "$tmp/venv" 2>/dev/null; then
      rm -rf "$tmp"
      say "not kept: cannot hard-link $venv into $cache (another file system?)"
      exit 0
    fi
    { absolute "$venv"; pwd -P; } > "$tmp/origin"
    mv -T "$tmp/venv" "$kept" || { rm -rf "$tmp"; exit 0; }  # another save got there first
    mv "$tmp/origin" "$origin_file"
    rmdir "$tmp"
    touch "$kept"
    # the two newest keys stay
    mapfile -t old < <(find "$cache" -mindepth 1 -maxdepth 1 -type d ! -name '.*' -printf '%T@ %p\n' \
      | sort -rn | tail -n +3 | cut -d' ' -f2-)
    for dir in "${old[@]}"; do rm -rf "$dir" "$dir.origin"; done
    say "kept $venv as $key (hard links)"
    ;;
  *) die "unknown action '$action' (restore, save)" ;;
esac
