//! Release builds of the `gpu-warden` binary lay out the code a running agent executes
//! together (`link/hot-symbols.txt`, lld's `--symbol-ordering-file`), so the agent keeps few
//! pages of its binary resident: the kernel maps file pages 64 KiB at a time around each
//! first touch, and the ~1.4 MiB it runs, spread over 11 MiB of code, kept about 6 MiB
//! resident (docs/performance.md, "Resident memory"; `scripts/link_order.py` records the
//! list and checks a binary).
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
    if env("PROFILE") != "release"
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
    let mut parts = release.split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (1, 90)
}
