//! Link settings of the `kubegrace-sidecar` binary only (its dependencies are
//! built as before).
//!
//! Packed relative relocations (`-z pack-relative-relocs`, DT_RELR): the
//! binary is position-independent, and its 10,700-12,000 relative
//! relocations as RELA entries are a 250-280 KiB table the loader reads at
//! every start, so it stays mapped: 5% of an idle sidecar's RSS
//! (bench/README.md, "Issue #14, third pass").
//! Packed, the table is a few KiB. The loader must understand DT_RELR:
//! glibc 2.36 and later, statically linked (the images) or not; the
//! dynamic binary then asks for `GLIBC_ABI_DT_RELR` and an older glibc
//! refuses it with a clear message. Done only when the build's own glibc
//! is 2.36 or later, which is what the binary is linked against.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" && glibc_at_least(2, 36) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// The build machine's glibc (`getconf GNU_LIBC_VERSION` prints `glibc 2.36`);
/// a cross build links against the same Debian release's glibc.
fn glibc_at_least(major: u32, minor: u32) -> bool {
    let Ok(out) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut numbers = text
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .split('.')
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let found = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    found >= (major, minor)
}
