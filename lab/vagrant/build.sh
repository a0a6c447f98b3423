#!/usr/bin/env bash
# Builds, inside the cp VM, from this checkout:
#   - the `cnilab` CLI, installed as /usr/local/bin/cnilab (for `cnilab e2e check`);
#   - the image from lab/image/Dockerfile with buildah, saved as
#     lab/vagrant/run/cnilab-image.tar for every node to import.
# With image_source=archive, lab/vagrant/run/cnilab-image.tar is taken as
# given (e.g. `docker save localhost/cnilab:vagrant -o lab/vagrant/run/cnilab-image.tar`
# on the host), and a prebuilt lab/vagrant/run/cnilab binary is used when present.
# Skips everything when the sources have not changed since the last build.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

require_env CNILAB_IMAGE CNILAB_IMAGE_SOURCE

readonly ARCHIVE=$RUN_DIR/cnilab-image.tar
readonly CACHE=/var/cache/cnilab
export RUSTUP_HOME=/opt/cnilab/rustup CARGO_HOME=/opt/cnilab/cargo
export PATH=$CARGO_HOME/bin:$PATH
mkdir -p "$RUN_DIR" "$STATE_DIR" "$CACHE"

# Everything a build reads, minus what the host builds and the VMs write.
# Built from a copy on the VM's own disk: faster than the synced folder, and
# the host's target/ never enters the image build context.
sync_context() {
  rsync -a --delete \
    --exclude=/target/ --exclude=/.git/ --exclude=/.vagrant/ --exclude=/lab/vagrant/run/ \
    "$REPO/" "$CACHE/src/"
}

source_digest() {
  (cd "$CACHE/src" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-64)
}

ensure_rust() {
  if [[ -x $CARGO_HOME/bin/cargo ]]; then
    return
  fi
  log "installing the Rust toolchain into /opt/cnilab"
  # protobuf-compiler: protoc for the CRI client crate (k8s-cri) of cnilab.
  apt_install build-essential pkg-config libssl-dev protobuf-compiler
  local triple
  case $(deb_arch) in
    amd64) triple=x86_64-unknown-linux-gnu ;;
    arm64) triple=aarch64-unknown-linux-gnu ;;
  esac
  local url="https://static.rust-lang.org/rustup/dist/$triple/rustup-init"
  download "$url" /tmp/rustup-init "$(sha256_from "$url.sha256")"
  chmod +x /tmp/rustup-init
  /tmp/rustup-init -y --quiet --profile minimal --default-toolchain stable --no-modify-path
  rm -f /tmp/rustup-init
}

build_cli() {
  if [[ $CNILAB_IMAGE_SOURCE == archive && -x $RUN_DIR/cnilab ]]; then
    log "installing the prebuilt lab/vagrant/run/cnilab"
    install -m 0755 "$RUN_DIR/cnilab" /usr/local/bin/cnilab
    return
  fi
  ensure_rust
  log "cargo build --release -p cnilab-harness"
  (cd "$CACHE/src" && cargo build --release --locked -p cnilab-harness --target-dir "$CACHE/target")
  install -m 0755 "$CACHE/target/release/cnilab" /usr/local/bin/cnilab
}

build_image() {
  if [[ $CNILAB_IMAGE_SOURCE == archive ]]; then
    [[ -s $ARCHIVE ]] || die "image_source=archive but $ARCHIVE is missing;" \
      "on the host: docker save $CNILAB_IMAGE -o lab/vagrant/run/cnilab-image.tar"
  else
    apt_install buildah
    log "buildah build -f lab/image/Dockerfile -t $CNILAB_IMAGE (several minutes the first time)"
    buildah build --quiet --layers -f "$CACHE/src/lab/image/Dockerfile" -t "$CNILAB_IMAGE" "$CACHE/src" >/dev/null
    rm -f "$ARCHIVE.tmp"
    buildah push --quiet "$CNILAB_IMAGE" "docker-archive:$ARCHIVE.tmp:$CNILAB_IMAGE"
    mv -f "$ARCHIVE.tmp" "$ARCHIVE"
  fi
  # Workers wait for the digest file, so it is written last.
  sha256sum "$ARCHIVE" | cut -c1-64 >"$ARCHIVE.sha256.tmp"
  mv -f "$ARCHIVE.sha256.tmp" "$ARCHIVE.sha256"
}

sync_context
digest="$(source_digest) $CNILAB_IMAGE_SOURCE $CNILAB_IMAGE"
if marked build "$digest" && [[ -x /usr/local/bin/cnilab && -s $ARCHIVE.sha256 && -s $ARCHIVE ]]; then
  log "cnilab and $CNILAB_IMAGE are up to date with the sources"
  exit 0
fi
build_cli
build_image
mark_done build "$digest"
log "built cnilab ($(/usr/local/bin/cnilab --version 2>/dev/null || echo 'version unknown')) and $CNILAB_IMAGE"
