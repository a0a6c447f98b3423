//! The sandbox image, made offline: one static pause binary (built from
//! `pause.c` by harness/build.rs) in a one-layer OCI image, written as an
//! OCI layout tar that `ctr images import` reads. The index names the
//! image ([`SANDBOX_IMAGE`]), so the CRI finds it and never pulls.

use super::SANDBOX_IMAGE;
use serde_json::json;

/// The static pause binary (empty when the build had no static C toolchain).
pub static PAUSE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pause"));

/// The OCI architecture name of the machine the harness was built for.
pub fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

fn sha256_hex(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A ustar archive of regular files and directories (names < 100 bytes).
#[derive(Default)]
struct Tar(Vec<u8>);

impl Tar {
    fn entry(&mut self, name: &str, mode: u32, data: Option<&[u8]>) {
        let mut h = [0u8; 512];
        let put = |h: &mut [u8; 512], at: usize, s: &[u8]| h[at..at + s.len()].copy_from_slice(s);
        put(&mut h, 0, name.as_bytes());
        put(&mut h, 100, format!("{mode:07o}\0").as_bytes());
        put(&mut h, 108, b"0000000\0");
        put(&mut h, 116, b"0000000\0");
        let size = data.map_or(0, <[u8]>::len);
        put(&mut h, 124, format!("{size:011o}\0").as_bytes());
        put(&mut h, 136, b"00000000000\0");
        put(&mut h, 148, b"        ");
        h[156] = if data.is_some() { b'0' } else { b'5' };
        put(&mut h, 257, b"ustar\x0000");
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        put(&mut h, 148, format!("{sum:06o}\0 ").as_bytes());
        self.0.extend_from_slice(&h);
        if let Some(data) = data {
            self.0.extend_from_slice(data);
            self.0.resize(self.0.len().next_multiple_of(512), 0);
        }
    }

    fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.entry(name, mode, Some(data));
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o755, None);
    }

    fn finish(mut self) -> Vec<u8> {
        self.0.extend_from_slice(&[0u8; 1024]);
        self.0
    }
}

/// A descriptor of `blob` with `media_type`; the blob goes into `blobs`.
fn add_blob(
    blobs: &mut Vec<(String, Vec<u8>)>,
    media_type: &str,
    blob: Vec<u8>,
) -> serde_json::Value {
    let digest = sha256_hex(&blob);
    let d =
        json!({"mediaType": media_type, "digest": format!("sha256:{digest}"), "size": blob.len()});
    blobs.push((digest, blob));
    d
}

/// The image as an OCI layout tar: `oci-layout`, `index.json` and the
/// blobs (uncompressed layer, config, manifest).
pub fn oci_layout_tar(pause: &[u8]) -> Vec<u8> {
    let mut layer = Tar::default();
    layer.file("pause", 0o755, pause);
    let layer = layer.finish();
    let mut blobs = Vec::new();
    let diff_id = format!("sha256:{}", sha256_hex(&layer));
    let layer_desc = add_blob(&mut blobs, "application/vnd.oci.image.layer.v1.tar", layer);
    let config = json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": {"Entrypoint": ["/pause"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    });
    let config_desc = add_blob(
        &mut blobs,
        "application/vnd.oci.image.config.v1+json",
        config.to_string().into_bytes(),
    );
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer_desc],
    });
    let mut manifest_desc = add_blob(
        &mut blobs,
        "application/vnd.oci.image.manifest.v1+json",
        manifest.to_string().into_bytes(),
    );
    let tag = SANDBOX_IMAGE.rsplit(':').next().unwrap_or("latest");
    manifest_desc["annotations"] = json!({
        "io.containerd.image.name": SANDBOX_IMAGE,
        "org.opencontainers.image.ref.name": tag,
    });
    manifest_desc["platform"] = json!({"architecture": oci_arch(), "os": "linux"});
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_desc],
    });
    let mut tar = Tar::default();
    tar.file("oci-layout", 0o644, br#"{"imageLayoutVersion":"1.0.0"}"#);
    tar.file("index.json", 0o644, index.to_string().as_bytes());
    tar.dir("blobs/");
    tar.dir("blobs/sha256/");
    for (digest, blob) in &blobs {
        tar.file(&format!("blobs/sha256/{digest}"), 0o644, blob);
    }
    tar.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads back (name, size, payload) of each entry of a ustar archive,
    /// checking each header's checksum.
    fn entries(tar: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at + 512 <= tar.len() && tar[at] != 0 {
            let h = &tar[at..at + 512];
            let name = String::from_utf8_lossy(&h[..100])
                .trim_end_matches('\0')
                .to_string();
            let field = |a: usize, b: usize| {
                let s = String::from_utf8_lossy(&h[a..b]);
                u64::from_str_radix(s.trim_matches(|c: char| c == '\0' || c == ' '), 8)
                    .expect("octal")
            };
            let size = field(124, 136) as usize;
            let mut copy = h.to_vec();
            copy[148..156].copy_from_slice(b"        ");
            let sum: u64 = copy.iter().map(|&b| u64::from(b)).sum();
            assert_eq!(field(148, 156), sum, "checksum of {name}");
            out.push((name, tar[at + 512..at + 512 + size].to_vec()));
            at += 512 + size.next_multiple_of(512);
        }
        out
    }

    #[test]
    fn the_layout_names_the_image_and_every_digest_matches() {
        let tar = oci_layout_tar(b"\x7fELF-not-really");
        let files = entries(&tar);
        let get = |n: &str| {
            files
                .iter()
                .find(|(name, _)| name == n)
                .map(|(_, d)| d.clone())
                .unwrap_or_else(|| panic!("{n} in the archive"))
        };
        let index: serde_json::Value = serde_json::from_slice(&get("index.json")).expect("json");
        let m = &index["manifests"][0];
        assert_eq!(m["annotations"]["io.containerd.image.name"], SANDBOX_IMAGE);
        for (name, data) in files
            .iter()
            .filter(|(n, _)| n.starts_with("blobs/sha256/") && !n.ends_with('/'))
        {
            assert_eq!(name.trim_start_matches("blobs/sha256/"), sha256_hex(data));
        }
        let digest = m["digest"]
            .as_str()
            .expect("digest")
            .trim_start_matches("sha256:");
        let manifest: serde_json::Value =
            serde_json::from_slice(&get(&format!("blobs/sha256/{digest}"))).expect("manifest");
        let layer_digest = manifest["layers"][0]["digest"].as_str().expect("layer");
        let layer = get(&format!(
            "blobs/sha256/{}",
            layer_digest.trim_start_matches("sha256:")
        ));
        let inner = entries(&layer);
        assert_eq!(
            inner,
            vec![("pause".to_string(), b"\x7fELF-not-really".to_vec())]
        );
    }
}
