//! `make release-cli` (cli/krew/release.sh): the krew manifest it writes names the archive it built, by
//! its real sha256, and the archive holds the plugin binary the manifest's `bin` names. Run here on the
//! test build of `kubectl-leasehold` (`--binary`), so no release build is needed.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("krew/release.sh")
}

fn release(out: &Path, base_url: &str) -> std::process::Output {
    Command::new(script())
        .args(["--base-url", base_url, "--out"])
        .arg(out)
        .arg("--binary")
        .arg(env!("CARGO_BIN_EXE_kubectl-leasehold"))
        .output()
        .expect("release.sh runs")
}

#[test]
fn the_manifest_names_the_archive_it_built_by_its_real_checksum() {
    let out = std::env::temp_dir().join(format!("leasehold-krew-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = release(&out, "https://downloads.example.com/leasehold/v1/");
    assert!(run.status.success(), "release.sh failed: {}", String::from_utf8_lossy(&run.stderr));
    let manifest: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(out.join("leasehold.yaml")).expect("manifest")).expect("yaml");
    assert_eq!(manifest["kind"].as_str(), Some("Plugin"));
    assert_eq!(manifest["metadata"]["name"].as_str(), Some("leasehold"));
    let version = format!("v{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(manifest["spec"]["version"].as_str(), Some(version.as_str()));
    let platforms = manifest["spec"]["platforms"].as_sequence().expect("platforms");
    assert_eq!(platforms.len(), 1, "one platform: the one built");
    let platform = &platforms[0];
    let uri = platform["uri"].as_str().expect("uri");
    let name = uri.strip_prefix("https://downloads.example.com/leasehold/v1/").expect("uri under the base URL");
    assert!(name.starts_with(&format!("leasehold-{version}-linux-")) && name.ends_with(".tar.gz"), "{name}");
    let archive = out.join(name);
    let bytes = std::fs::read(&archive).expect("the archive the manifest names exists");
    let sha = format!("{:x}", Sha256::digest(&bytes));
    assert_eq!(platform["sha256"].as_str(), Some(sha.as_str()), "the manifest's sha256 is the archive's");
    assert!(!sha.chars().all(|c| c == '0'));
    // The archive holds the binary the manifest installs, byte for byte.
    assert_eq!(platform["bin"].as_str(), Some("kubectl-leasehold"));
    assert_eq!(platform["files"][0]["from"].as_str(), Some("kubectl-leasehold"));
    let unpacked = out.join("unpacked");
    std::fs::create_dir_all(&unpacked).expect("dir");
    let tar = Command::new("tar").arg("xzf").arg(&archive).arg("-C").arg(&unpacked).status().expect("tar");
    assert!(tar.success());
    let packed = std::fs::read(unpacked.join("kubectl-leasehold")).expect("binary in the archive");
    assert!(packed == std::fs::read(env!("CARGO_BIN_EXE_kubectl-leasehold")).expect("binary"), "same binary");
    // Reproducible: the same binary gives the same checksum.
    let again = release(&out, "https://downloads.example.com/leasehold/v1");
    assert!(again.status.success());
    assert_eq!(format!("{:x}", Sha256::digest(std::fs::read(&archive).expect("archive"))), sha);
    std::fs::remove_dir_all(&out).expect("clean up");
}

#[test]
fn a_release_without_a_real_base_url_is_refused() {
    let out = std::env::temp_dir().join(format!("leasehold-krew-refused-{}", std::process::id()));
    let run = Command::new(script()).arg("--out").arg(&out).output().expect("release.sh runs");
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("--base-url is required"));
    let run = release(&out, "example.invalid/leasehold");
    assert!(!run.status.success(), "a URL without a scheme is refused");
    assert!(!out.join("leasehold.yaml").exists(), "no manifest written");
    let _ = std::fs::remove_dir_all(&out);
}
