//! images/push.sh, which pushes the images of `make images` to a registry of the user's: no registry
//! runs here, so its dry run is checked: the copy commands it would run (skopeo, else crane) name each
//! archive and REGISTRY/<component>:<appVersion>, and the chart values it prints name the same images.

use std::path::{Path, PathBuf};
use std::process::Command;

fn push(cache: &Path, tool: &str, args: &[&str]) -> std::process::Output {
    Command::new(PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../images/push.sh")))
        .args(args)
        .env("LEASEHOLD_CACHE", cache)
        .env("LEASEHOLD_PUSH_TOOL", tool)
        .output()
        .expect("push.sh runs")
}

fn app_version() -> String {
    let chart = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/leasehold/Chart.yaml"))
        .expect("Chart.yaml");
    let chart: serde_yaml_ng::Value = serde_yaml_ng::from_str(&chart).expect("yaml");
    chart["appVersion"].as_str().expect("appVersion").to_string()
}

#[test]
fn the_dry_run_prints_one_copy_per_image_to_the_users_registry() {
    let cache = std::env::temp_dir().join(format!("leasehold-push-{}", std::process::id()));
    let images = cache.join("images");
    std::fs::create_dir_all(&images).expect("dir");
    let version = app_version();

    // No archives yet: refused, pointing at `make images`.
    let missing = push(&cache, "skopeo", &["--dry-run", "registry.example.com/team"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("run `make images` first"));

    for component in ["operator", "worker"] {
        std::fs::write(images.join(format!("{component}.tar")), b"archive").expect("archive");
    }
    let out = push(&cache, "skopeo", &["--dry-run", "registry.example.com/team/"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for component in ["operator", "worker"] {
        let archive = images.join(format!("{component}.tar"));
        let copy = format!(
            "skopeo copy --dest-tls-verify=true oci-archive:{} docker://registry.example.com/team/{component}:{version}",
            archive.display()
        );
        assert!(stdout.lines().any(|l| l == copy), "{copy} in:\n{stdout}");
    }
    assert!(stdout.contains(
        "--set image.repository=registry.example.com/team/operator --set workerImage.repository=registry.example.com/team/worker"
    ));
    let crane = push(&cache, "crane", &["--dry-run", "localhost:5000"]);
    let stdout = String::from_utf8_lossy(&crane.stdout);
    assert!(
        stdout.contains(&format!("crane push {} localhost:5000/worker:{version}", images.join("worker.tar").display()))
    );

    // A URL is not a registry reference.
    let url = push(&cache, "skopeo", &["--dry-run", "https://registry.example.com"]);
    assert!(!url.status.success());
    std::fs::remove_dir_all(&cache).expect("clean up");
}
