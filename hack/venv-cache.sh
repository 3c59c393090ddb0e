#!/usr/bin/env bash
# The virtual environment kept between checkouts, so that a fresh clone (CI's, a second work tree) does not
# install its ~6 GB of wheels again (about 200 s on 2 cores, from pip's cache).
#
#   hack/venv-cache.sh restore VENV PYPROJECT...   VENV absent: made from the kept venv of this key; exit 1
#                                                  when none is kept (the caller then makes a new one)
#   hack/venv-cache.sh save VENV PYPROJECT...      keep VENV under this key (after a complete install)
#
# The key: a hash of the pyproject.toml files (every pin), the Python that makes the venv and the machine.
# Kept under $CHATFLEET_CACHE/venvs/<key>/ (default ~/.cache/chatfleet), the two newest keys only.
#
# Both copies are hard links to the same files, so keeping one costs no disk while its venv exists, and a
# restore takes seconds. Neither can change the other: pip and Python replace files (a new file renamed
# over the old, or the old one removed), never write into one; the only files that name the venv's own
# path (its scripts' #! lines, pyvenv.cfg) are written anew by the restore. The editable installs of this
# repository's packages name the clone they came from: the Makefile's pip install that follows every
# restore installs them again from this clone. A restored venv has no install stamp until that install
# has succeeded. Where the cache and the clone are on different file systems (no hard links) nothing is
# kept, and every clone installs as before.
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

case $action in
  restore)
    [ ! -e "$venv" ] || die "$venv exists: restore makes a venv only where there is none"
    [ -d "$kept" ] && [ -f "$origin_file" ] || { say "no venv kept for key $key"; exit 1; }
    origin=$(cat "$origin_file")
    target=$(absolute "$venv")
    started=$(date +%s)
    tmp=$target.restoring
    rm -rf "$tmp"
    mkdir -p "$(dirname "$target")"
    cp -al "$kept" "$tmp" 2>/dev/null || { rm -rf "$tmp"; say "cannot hard-link $kept to $tmp (another file system?)"; exit 1; }
    rm -f "$tmp"/.installed-*
    if [ "$origin" != "$target" ]; then
      # sed -i writes a new file and renames it over the link: the kept copy keeps its own
      { grep -rlIZ -F "$origin" "$tmp/bin" "$tmp/pyvenv.cfg" || true; } | xargs -0 -r sed -i "s#${origin}#${target}#g"
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
    absolute "$venv" > "$tmp/origin"
    mv "$tmp/origin" "$origin_file"
    mv -T "$tmp/venv" "$kept" || { rm -rf "$tmp"; exit 0; }  # another save got there first
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
