//! The CRI as kubelet speaks it, with nothing of a lab in it: the v1 client
//! over a runtime's socket ([`client`]) and the offline sandbox image
//! ([`image`]: a static pause binary in an OCI layout tar). `capture` asks a
//! node's CRI for its sandboxes' names; `lab --runtime containerd` and
//! `e2e vagrant` run pods through it.

pub mod client;
pub mod image;

pub use client::Cri;

/// The image a lab's CRI uses as its sandbox (pause) image.
pub const SANDBOX_IMAGE: &str = "cnilab.local/pause:1";
