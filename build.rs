//! `dist` builds (`cargo build --profile dist`, the shipped binary: the image and the H200
//! runs) of the `gpu-warden` binary lay out the code a running agent executes
//! together (`link/hot-symbols.txt`, lld's `--symbol-ordering-file`), so the agent keeps few
//! pages of its binary resident: the kernel maps file pages 64 KiB at a time around each
//! first touch, and the ~1.4 MiB it runs, spread over 11 MiB of code, kept about 6 MiB
//! resident (docs/performance.md, "Resident memory"; `scripts/link_order.py` records the
//! list and checks a binary).
//!
//! The same builds pack their relative relocations (`-z pack-relative-relocs`, DT_RELR) when
//! the C library they are built against is glibc 2.36 or later (the image's Debian 12 has
//! 2.36): the dynamic loader reads the whole relocation table at start and its pages stay
//! resident, 450 KiB of them in the classic format, a few KiB packed.
//!
//! The quick start's `--release` build is linked plainly (the layout only pays with the
//! `dist` profile's whole-program LTO). Cargo tells a build script only whether a profile
//! inherits from `release` (`PROFILE`), not its name, so the name is read from `OUT_DIR`
//! (`<target>/[<triple>/]<profile>/build/<pkg>-<hash>/out`).
//!
//! Only where the linker is known to be lld: rustc 1.90 or later on x86_64 Linux with no
//! linker chosen in the flags. Elsewhere, or with `GPU_WARDEN_LINK_ORDER=off`, the binary is
//! linked as before; the order changes where code sits, never what it does.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=link/hot-symbols.txt");
    println!("cargo:rerun-if-env-changed=GPU_WARDEN_LINK_ORDER");
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    if profile_name(&env("OUT_DIR")) != Some(LAID_OUT_PROFILE)
        || env("GPU_WARDEN_LINK_ORDER") == "off"
        || env("TARGET") != "x86_64-unknown-linux-gnu"
        || env("CARGO_ENCODED_RUSTFLAGS").contains("linker")
        || std::env::var_os("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER").is_some()
        || !rustc_links_with_lld(&env("RUSTC"))
    {
        return;
    }
    let list = Path::new(&env("CARGO_MANIFEST_DIR")).join("link/hot-symbols.txt");
    if !list.is_file() {
        return;
    }
    println!(
        "cargo:rustc-link-arg-bin=gpu-warden=-Wl,--symbol-ordering-file={}",
        list.display()
    );
    // Names the list has and the binary no longer does are expected between re-recordings.
    println!("cargo:rustc-link-arg-bin=gpu-warden=-Wl,--no-warn-symbol-ordering");
    if glibc_at_least(2, 36) {
        println!("cargo:rustc-link-arg-bin=gpu-warden=-Wl,-z,pack-relative-relocs");
    }
}

/// The Cargo profile whose builds are laid out (Cargo.toml, `[profile.dist]`).
const LAID_OUT_PROFILE: &str = "dist";

/// The profile's directory name in `OUT_DIR`: three levels above `out`.
fn profile_name(out_dir: &str) -> Option<&str> {
    Path::new(out_dir).ancestors().nth(3)?.file_name()?.to_str()
}

/// Whether the build machine's glibc (the one the binary is linked against) is at least
/// `major.minor`: older ones cannot load packed relocations.
fn glibc_at_least(major: u32, minor: u32) -> bool {
    let Ok(out) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return false;
    };
    // "glibc 2.36"
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(version) = text.trim().strip_prefix("glibc ") else {
        return false;
    };
    major_minor(version) >= (major, minor)
}

/// The first two numbers of a version such as `2.36`, `1.95.0` or `1.96.0-nightly`; a part
/// that is not a number counts as 0.
fn major_minor(version: &str) -> (u32, u32) {
    let mut parts = version
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Whether `rustc` is 1.90 or later, whose default linker on x86_64 Linux is its own lld.
fn rustc_links_with_lld(rustc: &str) -> bool {
    let Ok(out) = Command::new(if rustc.is_empty() { "rustc" } else { rustc })
        .arg("-vV")
        .output()
    else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(release) = text.lines().find_map(|l| l.strip_prefix("release: ")) else {
        return false;
    };
    major_minor(release) >= (1, 90)
}
