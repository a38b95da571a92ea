//! plugin/krew/manifest writes the krew manifest from real archives: each platform's
//! sha256 is the archive's, and a bad archive leaves no manifest at all.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("krew/manifest")
}

/// The manifest script's output for these archives (version v0.1.0).
fn manifest(archives: &[&Path]) -> std::process::Output {
    Command::new(script())
        .arg("v0.1.0")
        .args(archives)
        .output()
        .expect("manifest")
}

/// The manifest of these archives, which the script must accept.
fn good_manifest(archives: &[&Path]) -> serde_norway::Value {
    let out = manifest(archives);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_norway::from_slice(&out.stdout).expect("YAML")
}

/// A fresh directory under the system temp dir.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kg-krew-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// `kubectl-kubegrace_v0.1.0_<os>_<arch>.tar.gz` holding a file `kubectl-kubegrace`.
fn archive(dir: &Path, os_arch: &str, content: &str) -> PathBuf {
    let stage = dir.join(format!("stage-{os_arch}"));
    std::fs::create_dir_all(&stage).expect("stage");
    std::fs::write(stage.join("kubectl-kubegrace"), content).expect("binary");
    let out = dir.join(format!("kubectl-kubegrace_v0.1.0_{os_arch}.tar.gz"));
    run_tool(
        Command::new("tar")
            .arg("-czf")
            .arg(&out)
            .arg("-C")
            .arg(&stage)
            .arg("kubectl-kubegrace"),
        "tar",
    );
    out
}

/// Runs a tool that makes a fixture; the test fails with it.
fn run_tool(command: &mut Command, what: &str) {
    let status = command.status().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(status.success(), "{what} failed: {status}");
}

#[test]
fn every_platform_carries_the_sha256_of_its_archive() {
    let dir = scratch("ok");
    let amd = archive(&dir, "linux_amd64", "amd64 binary");
    let arm = archive(&dir, "linux_arm64", "arm64 binary");
    let doc = good_manifest(&[&amd, &arm]);
    assert_eq!(doc["kind"], "Plugin");
    assert_eq!(doc["metadata"]["name"], "kubegrace");
    assert_eq!(doc["spec"]["version"], "v0.1.0");
    let platforms = doc["spec"]["platforms"].as_sequence().expect("platforms");
    assert_eq!(platforms.len(), 2);
    for (p, (file, arch)) in platforms.iter().zip([(&amd, "amd64"), (&arm, "arm64")]) {
        let bytes = std::fs::read(file).expect("archive");
        let sha = format!("{:x}", Sha256::digest(&bytes));
        assert_eq!(p["sha256"].as_str(), Some(sha.as_str()));
        assert_eq!(p["selector"]["matchLabels"]["arch"], arch);
        assert_eq!(p["bin"], "kubectl-kubegrace");
        let name = file.file_name().and_then(|n| n.to_str()).expect("name");
        assert_eq!(
            p["uri"].as_str(),
            Some(
                format!("https://github.com/kubegrace/kubegrace/releases/download/v0.1.0/{name}")
                    .as_str()
            )
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_or_misnamed_archive_gives_no_manifest() {
    let dir = scratch("bad");
    let good = archive(&dir, "linux_amd64", "binary");
    let misnamed = dir.join("kubegrace-linux.tar.gz");
    std::fs::copy(&good, &misnamed).expect("copy");
    for bad in [dir.join("absent.tar.gz"), misnamed] {
        let out = manifest(&[&good, &bad]);
        assert!(!out.status.success(), "{bad:?} accepted");
        assert!(out.stdout.is_empty(), "half a manifest for {bad:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kubectl-kubegrace_v0.1.0_windows_<arch>.zip` holding `kubectl-kubegrace.exe`
/// (and `LICENSE`), written with python's zipfile as the release workflow's
/// Windows job writes it with PowerShell's Compress-Archive: the same format.
fn windows_zip(dir: &Path, arch: &str, members: &[&str]) -> PathBuf {
    let out = dir.join(format!("kubectl-kubegrace_v0.1.0_windows_{arch}.zip"));
    run_tool(
        Command::new("python3")
            .arg("-c")
            .arg(
                "import sys, zipfile\n\
                 with zipfile.ZipFile(sys.argv[1], 'w') as z:\n\
                 \x20   [z.writestr(m, 'content of ' + m) for m in sys.argv[2:]]",
            )
            .arg(&out)
            .args(members),
        "zip (python3)",
    );
    out
}

#[test]
fn windows_archives_are_zips_with_the_exe() {
    let dir = scratch("windows");
    let linux = archive(&dir, "linux_amd64", "amd64 binary");
    let win = windows_zip(&dir, "arm64", &["kubectl-kubegrace.exe", "LICENSE"]);
    let doc = good_manifest(&[&linux, &win]);
    let platforms = doc["spec"]["platforms"].as_sequence().expect("platforms");
    assert_eq!(platforms.len(), 2);
    let windows = &platforms[1];
    assert_eq!(windows["selector"]["matchLabels"]["os"], "windows");
    assert_eq!(windows["selector"]["matchLabels"]["arch"], "arm64");
    assert_eq!(windows["bin"], "kubectl-kubegrace.exe");
    assert_eq!(windows["files"][0]["from"], "kubectl-kubegrace.exe");
    assert_eq!(windows["files"][1]["from"], "LICENSE");
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&win).expect("zip")));
    assert_eq!(windows["sha256"].as_str(), Some(sha.as_str()));
    // The Linux entry keeps its binary name.
    assert_eq!(platforms[0]["bin"], "kubectl-kubegrace");

    // A zip without the .exe, or a Windows tar.gz, gives no manifest.
    let no_exe = dir.join("no-exe");
    std::fs::create_dir_all(&no_exe).expect("dir");
    let bad_zip = windows_zip(&no_exe, "amd64", &["kubectl-kubegrace"]);
    let tar_for_windows = archive(&dir, "windows_amd64", "binary");
    for bad in [bad_zip, tar_for_windows] {
        let out = manifest(&[&bad]);
        assert!(!out.status.success(), "{bad:?} accepted");
        assert!(out.stdout.is_empty(), "half a manifest for {bad:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
