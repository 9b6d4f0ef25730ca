//! The walls the compiler and clippy keep, proved rather than assumed: the workspace's
//! manifests and rooms are copied, each bypass issue 40 found is injected into the copy, and
//! `cargo clippy` on the room's crate must refuse it with the expected error. The unchanged
//! copy is checked first, so a refusal is the injection's and not the copy's.
//!
//! Each case runs clippy once on one or two small crates (model, guard; their dependencies
//! are built once into `target/walls` and kept), about five seconds each here.

use crate::support::root;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the copy needs to resolve the workspace: the manifests and every member.
const COPIED: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "clippy.toml",
    "src",
    "crates",
    "benches",
];

fn copy(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap().flatten() {
            let name = entry.file_name();
            if name == "target" || name.to_string_lossy().starts_with('.') {
                continue;
            }
            copy(&entry.path(), &to.join(name));
        }
    } else {
        // Follows links: src/guard/clippy.toml is one.
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap();
    }
}

struct WorkspaceCopy {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl WorkspaceCopy {
    fn new() -> WorkspaceCopy {
        let target = root().join("target");
        std::fs::create_dir_all(&target).unwrap();
        let dir = tempfile::tempdir_in(&target).unwrap();
        let copy_root = dir.path().join("ws");
        for p in COPIED {
            copy(&root().join(p), &copy_root.join(p));
        }
        WorkspaceCopy {
            _dir: dir,
            root: copy_root,
        }
    }

    /// `cargo clippy` on `packages`: (success, the compiler's messages).
    fn clippy(&self, packages: &[&str]) -> (bool, String) {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(&self.root)
            .args([
                "clippy",
                "--offline",
                "--locked",
                "--message-format",
                "short",
            ])
            .env("CARGO_TARGET_DIR", root().join("target/walls"))
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS");
        for p in packages {
            cmd.args(["-p", p]);
        }
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Applies `edits` (file, text appended), runs clippy on `packages`, then undoes them.
    fn with(&self, edits: &[(&str, &str)], packages: &[&str]) -> (bool, String) {
        let saved: Vec<(PathBuf, String)> = edits
            .iter()
            .map(|(f, _)| {
                let p = self.root.join(f);
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                (p, text)
            })
            .collect();
        for ((_, add), (p, text)) in edits.iter().zip(&saved) {
            std::fs::write(p, format!("{text}\n{add}\n")).unwrap();
        }
        let result = self.clippy(packages);
        for (p, text) in saved {
            std::fs::write(p, text).unwrap();
        }
        result
    }
}

/// One bypass: where it goes, what it writes, and what the refusal must say.
struct Case {
    what: &'static str,
    edits: &'static [(&'static str, &'static str)],
    package: &'static str,
    refusal: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        what: "`use super::super::super::*;` then `act::…` in src/guard",
        edits: &[(
            "src/guard/state/step.rs",
            "#[allow(unused_imports)]\nuse super::super::super::*;\npub fn injected() -> std::time::Duration {\n    act::enforce::walk_budget(std::time::Duration::from_secs(1))\n}",
        )],
        package: "gpu-warden-guard",
        refusal: &["src/guard/state/step.rs", "error"],
    },
    Case {
        what: "`use crate::*;` then `act::…` in src/model",
        edits: &[(
            "src/model/ids.rs",
            "#[allow(unused_imports)]\nuse crate::*;\npub fn injected() -> std::time::Duration {\n    act::enforce::walk_budget(std::time::Duration::from_secs(1))\n}",
        )],
        package: "gpu-warden-model",
        refusal: &["src/model/ids.rs", "`act`"],
    },
    Case {
        what: "`extern crate self as me; use me::act::…` in src/model",
        edits: &[(
            "src/model/mod.rs",
            "extern crate self as me;\n#[allow(unused_imports)]\npub use me::act::enforce::walk_budget;",
        )],
        package: "gpu-warden-model",
        refusal: &["src/model/mod.rs", "error", "act"],
    },
    Case {
        what: "`#[path = \"../act/signal.rs\"] mod x;` in src/guard",
        edits: &[(
            "src/guard/mod.rs",
            "#[allow(clippy::duplicate_mod, dead_code)]\n#[path = \"../act/signal.rs\"]\nmod injected;",
        )],
        package: "gpu-warden-guard",
        refusal: &["signal.rs", "error"],
    },
    Case {
        what: "a `#[macro_export]` macro of src/act called from src/guard",
        edits: &[
            (
                "src/act/mod.rs",
                "#[macro_export]\nmacro_rules! injected_act {\n    () => {\n        1\n    };\n}",
            ),
            ("src/guard/mod.rs", "pub fn injected() -> i32 {\n    injected_act!()\n}"),
        ],
        package: "gpu-warden-guard",
        refusal: &["src/guard/mod.rs", "injected_act"],
    },
    Case {
        what: "`rustix::process::getpid()` in src/guard",
        edits: &[(
            "src/guard/levels.rs",
            "pub fn injected() -> i32 {\n    rustix::process::getpid().as_raw_nonzero().get()\n}",
        )],
        package: "gpu-warden-guard",
        refusal: &["src/guard/levels.rs", "rustix"],
    },
    Case {
        what: "`tokio_rustls` in src/model",
        edits: &[(
            "src/model/units.rs",
            "pub type Injected = tokio_rustls::TlsAcceptor;",
        )],
        package: "gpu-warden-model",
        refusal: &["src/model/units.rs", "tokio_rustls"],
    },
    Case {
        what: "`heap_trim` in src/guard",
        edits: &[(
            "src/guard/levels.rs",
            "pub fn injected() -> bool {\n    heap_trim::release_freed_memory()\n}",
        )],
        package: "gpu-warden-guard",
        refusal: &["src/guard/levels.rs", "heap_trim"],
    },
    Case {
        what: "`std::io::stdin()` in src/guard",
        edits: &[(
            "src/guard/levels.rs",
            "pub fn injected() -> usize {\n    let mut s = String::new();\n    std::io::stdin().read_line(&mut s).unwrap_or(0)\n}",
        )],
        package: "gpu-warden-guard",
        refusal: &["src/guard/levels.rs", "disallowed method `std::io::stdin`"],
    },
    Case {
        what: "`std::env::var` in src/model",
        edits: &[(
            "src/model/units.rs",
            "pub fn injected() -> bool {\n    std::env::var(\"X\").is_ok()\n}",
        )],
        package: "gpu-warden-model",
        refusal: &["src/model/units.rs", "disallowed method `std::env::var`"],
    },
    Case {
        what: "`std::os::unix::net::UnixStream` in src/guard",
        edits: &[(
            "src/guard/levels.rs",
            "pub fn injected() -> bool {\n    std::os::unix::net::UnixStream::connect(\"/x\").is_ok()\n}",
        )],
        package: "gpu-warden-guard",
        refusal: &[
            "src/guard/levels.rs",
            "disallowed type `std::os::unix::net::UnixStream`",
        ],
    },
    Case {
        what: "`println!` in src/model",
        edits: &[(
            "src/model/units.rs",
            "pub fn injected() {\n    println!(\"hello\");\n}",
        )],
        package: "gpu-warden-model",
        refusal: &["src/model/units.rs", "disallowed macro `std::println`"],
    },
];

#[test]
fn each_bypass_is_refused_by_the_compiler_or_clippy() {
    let copy = WorkspaceCopy::new();
    let (ok, out) = copy.clippy(&["gpu-warden-model", "gpu-warden-guard"]);
    assert!(ok, "the unchanged copy must pass clippy:\n{out}");
    let mut missed = Vec::new();
    for case in CASES {
        let (ok, out) = copy.with(case.edits, &[case.package]);
        if ok || !case.refusal.iter().all(|r| out.contains(r)) {
            missed.push(format!(
                "{}: {} (wanted {:?}):\n{out}",
                case.what,
                if ok { "accepted" } else { "refused otherwise" },
                case.refusal
            ));
        }
    }
    assert!(missed.is_empty(), "{}", missed.join("\n\n"));
}
