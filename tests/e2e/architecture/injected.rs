//! The checks themselves: a small tree with each violation of issue 29 injected, and the
//! lawful look-alikes next to them, so a check that misses one (or cries wolf) fails here.

use super::{codemap, crates, doc, rules, tidy};
use std::path::Path;

const DOC: &str = "\
# Architecture
<!-- rooms -->
| room | what | may import |
|---|---|---|
| `model` | vocabulary | — |
| `guard` | pure core | model |
| `act` | shells | model, kubeapi, guard |
| `kubeapi` | typed calls | — |
<!-- /rooms -->
Shells (<!-- io -->`tokio`, `kube`, `std::fs`, `std::net`, `std::process`, `std::thread`<!-- /io -->),
pure rooms' crates (<!-- pure-deps -->`serde`, `thiserror`<!-- /pure-deps -->),
typed calls (<!-- kubeapi-only -->`kube::Api`, `kube::api::Api`, `kube::runtime::watcher::watcher`<!-- /kubeapi-only -->):
<!-- shells -->
- `act/e.rs`, `act/call.rs`, `act/watch.rs`
- `kubeapi/mod.rs`, `kubeapi/pods.rs`
<!-- /shells -->
";

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn has(found: &[String], frag: &str) -> bool {
    found.iter().any(|f| f.contains(frag))
}

/// Each of `want` is found, and nothing else is.
fn exactly(found: &[String], want: &[&str]) {
    for w in want {
        assert!(has(found, w), "missed {w:?} in {found:#?}");
    }
    assert_eq!(found.len(), want.len(), "{found:#?}");
}

#[test]
fn each_kind_of_room_and_io_violation_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let w = |rel: &str, text: &str| write(root, rel, text);
    w("src/model/a.rs", "use crate::guard::x;\n");
    w("src/model/reexport.rs", "pub use crate::guard::Thing;\n");
    w(
        "src/guard/b.rs",
        "use tokio::sync::watch;\nuse crate::model::y;\n",
    );
    // After the test module: a text scan stops at `#[cfg(test)]`.
    w(
        "src/guard/after_tests.rs",
        "fn a() {}\n#[cfg(test)]\nmod tests {\n    use tokio::x;\n    use crate::act::z;\n}\nuse crate::act::y;\n",
    );
    w(
        "src/guard/state/step.rs",
        "fn f() {\n    super::super::super::act::go();\n}\n",
    );
    w("src/guard/pure.rs", "use std::{fs, thread};\n");
    w(
        "src/guard/rt.rs",
        "use ::tokio as rt;\nfn f() {\n    rt::spawn(async {});\n}\n",
    );
    w(
        "src/guard/aliased.rs",
        "use std as s;\nfn f() -> bool {\n    s::net::Ipv4Addr::LOCALHOST.is_loopback()\n}\n",
    );
    w(
        "src/guard/in_macro.rs",
        "fn f() -> String {\n    format!(\"{}\", std::process::id())\n}\n",
    );
    w(
        "src/guard/nested.rs",
        "mod inner {\n    fn f() {\n        let _ = crate::act::go;\n    }\n}\n",
    );
    w("src/guard/above.rs", "use super::super::super::x;\n");
    w(
        "src/guard/borrowed.rs",
        "#[allow(clippy::duplicate_mod)]\n#[path = \"../act/e.rs\"]\nmod x;\n",
    );
    // Lawful: a sibling, the vocabulary room, std's pure modules, I/O in strings, comments
    // and test code, an upward name in a test module, a shell using tokio.
    w(
        "src/guard/fine.rs",
        "//! tokio::spawn and crate::act in a comment\nuse super::b;\nuse crate::model::y;\nuse std::{fmt, collections::BTreeMap};\nfn f() -> &'static str {\n    \"tokio::spawn std::fs\"\n}\n#[test]\nfn t() {\n    std::fs::read(\"x\").ok();\n}\n#[cfg(test)]\nmod tests {\n    use crate::act::z;\n    use std::thread;\n}\n",
    );
    w(
        "src/act/e.rs",
        "use tokio::net::TcpStream;\nuse crate::guard::z;\n",
    );
    w("src/mystery/f.rs", "\n");
    // kube's typed calls outside `kubeapi`, by either name and through a module alias; the
    // lawful look-alikes: `kubeapi` itself, kube's watcher module (its `Config`, its
    // `Event`), a pure file's root alias of the room, and test code.
    w(
        "src/act/call.rs",
        "use kube::api::{Api, PostParams};\nfn f(c: kube::Client) {\n    let _: kube::Api<P> = Api::all(c);\n}\n#[cfg(test)]\nmod tests {\n    use kube::Api;\n}\n",
    );
    w(
        "src/act/watch.rs",
        "use kube::runtime::watcher as w;\nfn f() {\n    let _ = w::Config::default();\n    let _ = w::watcher(api, cfg);\n}\n",
    );
    w(
        "src/kubeapi/pods.rs",
        "use kube::api::Api;\nuse kube::runtime::watcher;\nfn f() {\n    watcher::watcher(api, cfg);\n}\n",
    );
    w(
        "src/kubeapi/mod.rs",
        "mod pods;\nuse kube::runtime::watcher;\n",
    );
    w("src/act/root.rs", "use gpu_warden_kubeapi as kubeapi;\n");
    w("src/act/pure.rs", "use crate::act::e::Shell;\n");
    let doc = doc::parse(DOC).unwrap();
    let found = rules::check_rooms(root, &doc);
    let want = [
        "src/model/a.rs:1: room `model` may not import `crate::guard`",
        "src/model/reexport.rs:1: room `model` may not import `crate::guard`",
        "src/guard/b.rs:1: uses `tokio` but is not listed as a shell",
        "src/guard/after_tests.rs:7: room `guard` may not import `crate::act`",
        "src/guard/state/step.rs:2: room `guard` may not import `crate::act` (`crate::act::go`",
        "src/guard/pure.rs:1: uses `std::fs`",
        "src/guard/pure.rs:1: uses `std::thread`",
        "src/guard/rt.rs:1: uses `tokio`",
        "src/guard/aliased.rs:3: uses `std::net`",
        "src/guard/in_macro.rs:2: uses `std::process`",
        "src/guard/nested.rs:3: room `guard` may not import `crate::act`",
        "src/guard/above.rs:1: a `super::` climbs above the crate root",
        "src/guard/borrowed.rs:3: a `#[path]` module",
        "src/mystery/f.rs: its room `mystery` is not in the rooms table",
        "src/act/pure.rs:1: is pure but names `crate::act::e::Shell` of the shell act/e.rs",
        "src/act/call.rs:1: names `kube::api::Api`: a typed Kubernetes API call is made through `kubeapi`",
        "src/act/call.rs:3: names `kube::Api`",
        "src/act/watch.rs:4: names `kube::runtime::watcher::watcher`",
    ];
    assert!(!has(&found, "fine.rs"), "{found:#?}");
    assert!(
        !has(&found, "src/act/e.rs"),
        "a shell may use tokio: {found:#?}"
    );
    exactly(&found, &want);
}

#[test]
fn the_size_rule_counts_code_wherever_it_sits() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let max = rules::MAX_LINES;
    let code = |n: usize| "fn a() {}\n".repeat(n);
    let tests = format!("#[cfg(test)]\nmod tests {{\n{}}}\n", code(700));
    // As sample/sim.rs was: production code after its test module.
    write(
        root,
        "src/sample/sim.rs",
        &format!("{}{tests}{}", code(max / 2), code(max / 2 + 1)),
    );
    write(
        root,
        "src/sample/tested.rs",
        &format!("{}{tests}// comments\n// do not count\n", code(max)),
    );
    write(root, "crates/double/src/http.rs", &code(max + 1));
    write(root, "crates/double/src/allowed.rs", &code(max + 1));
    write(root, "src/small.rs", &code(10));
    let found = rules::check_sizes(root, &["crates/double/src/allowed.rs", "src/small.rs"]);
    let want = [
        "src/sample/sim.rs: 601 lines of non-test code",
        "crates/double/src/http.rs: 601 lines",
        "src/small.rs is allowed over the size limit but is not over it",
    ];
    exactly(&found, &want);
}

#[test]
fn a_path_to_nowhere_in_a_comment_or_a_doc_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let w = |rel: &str, text: &str| write(root, rel, text);
    w("src/lib.rs", "pub mod guard;\npub mod model;\n");
    w("src/model/mod.rs", "pub mod clock;\npub use clock::*;\n");
    w(
        "src/model/clock.rs",
        "//! The clock (docs/guard.md, src/model/clock.rs; not src/clock.rs).\npub struct Clock;\nimpl Clock {\n    pub fn mono(&self) {}\n}\n",
    );
    w(
        "src/guard/mod.rs",
        "//! Reads [`crate::model::clock::Clock`] and [`super::model::clock`], not\n//! [`crate::guard::watch`] nor `model::units`; see docs/metrics.md.\npub mod rank;\n",
    );
    w(
        "src/guard/rank.rs",
        "/// [`super::rank`], [`super::state`], `Clock::mono()`, <https://example.com/a/b.rs>.\npub fn rank() {}\n",
    );
    w(
        "docs/guard.md",
        "See `src/guard/rank.rs`, `guard::rank::rank`, `guard/rank.rs`, `rank.rs`, \
         `model::Clock` (re-exported), not `model::Calendar`.\n",
    );
    w(
        "docs/architecture.md",
        "`guard/watch.rs`, `model::clock::Clock::mono`, `guard::ghost`, `tokio::sync::watch`, `hw/guard_*.py`.\n",
    );
    w(
        "README.md",
        "Start at docs/architecture.md and docs/nowhere.md.\n",
    );
    w(
        "Cargo.toml",
        "# The fake kubelet of tests/podresources_kubelet.rs\n[package]\nname = \"x\"\n",
    );
    let found = tidy::check(root);
    let want = [
        "src/model/clock.rs: `src/clock.rs` does not exist",
        "src/guard/mod.rs: `crate::guard::watch` names nothing",
        "src/guard/mod.rs: `model::units` names nothing",
        "src/guard/mod.rs: `docs/metrics.md` does not exist",
        "src/guard/rank.rs: `super::state` names nothing",
        "docs/architecture.md: `guard/watch.rs` does not exist",
        "docs/architecture.md: `guard::ghost` names nothing",
        "docs/guard.md: `model::Calendar` names nothing",
        "README.md: `docs/nowhere.md` does not exist",
        "Cargo.toml: `tests/podresources_kubelet.rs` does not exist",
    ];
    exactly(&found, &want);
}

const ROOT_CLIPPY: &str =
    "disallowed-methods = [\n  { path = \"std::time::Instant::now\", reason = \"clock\" },\n]\n";

/// Every ban a pure room's clippy.toml must carry (the root's and the pure list).
fn pure_clippy() -> String {
    let paths = [
        "std::time::Instant::now",
        "std::fs::read",
        "std::env::var",
        "std::thread::spawn",
        "std::process::exit",
        "std::net::TcpStream",
        "std::os::unix::net::UnixStream",
        "std::io::stdin",
        "std::io::stdout",
        "std::io::stderr",
        "std::println",
        "std::eprintln",
    ];
    paths
        .iter()
        .map(|p| format!("  {{ path = \"{p}\", reason = \"pure\" }},\n"))
        .collect()
}

fn manifest(room: &str, deps: &[&str], dev: &[&str]) -> String {
    let line = |d: &&str| format!("{d} = {{ workspace = true }}\n");
    format!(
        "[package]\nname = \"gpu-warden-{room}\"\n\n[lib]\npath = \"mod.rs\"\n\n[dependencies]\n{}\n[dev-dependencies]\n{}",
        deps.iter().map(line).collect::<String>(),
        dev.iter().map(line).collect::<String>()
    )
}

#[test]
fn each_kind_of_manifest_violation_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let w = |rel: &str, text: &str| write(root, rel, text);
    w("clippy.toml", ROOT_CLIPPY);
    // Lawful: model pure with its bans; act as its row says, its tests on the fixtures.
    w(
        "src/model/Cargo.toml",
        &manifest("model", &["serde", "thiserror"], &[]),
    );
    w("src/model/clippy.toml", &pure_clippy());
    w(
        "src/act/Cargo.toml",
        &manifest(
            "act",
            &[
                "gpu-warden-model",
                "gpu-warden-kubeapi",
                "gpu-warden-guard",
                "tokio",
                "kube",
            ],
            &["gpu-warden-fixtures"],
        ),
    );
    // guard: a dependency beyond its row, an I/O crate in a pure room, a test reaching up,
    // and no clippy.toml.
    w(
        "src/guard/Cargo.toml",
        &manifest(
            "guard",
            &["gpu-warden-model", "gpu-warden-act", "tokio"],
            &["gpu-warden-act", "gpu-warden-fixtures"],
        ),
    );
    let doc = doc::parse(DOC).unwrap();
    let found = crates::check(root, &doc);
    let want = [
        "src/guard/Cargo.toml: depends on the rooms [act, model] but its row of the rooms table says [model]",
        "src/guard/Cargo.toml: the pure room `guard` depends on `tokio`",
        "src/guard/clippy.toml: missing",
    ];
    exactly(&found, &want);
    // A pure room whose clippy.toml lost the root's clock ban and the printing bans; a room
    // that is no crate; a test reaching further than the code.
    w(
        "src/model/clippy.toml",
        &pure_clippy()
            .lines()
            .filter(|l| !l.contains("Instant") && !l.contains("\"std::println\""))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    w(
        "src/guard/Cargo.toml",
        &manifest("guard", &["gpu-warden-model"], &["gpu-warden-act"]),
    );
    w("src/guard/clippy.toml", &pure_clippy());
    std::fs::remove_file(root.join("src/act/Cargo.toml")).unwrap();
    let found = crates::check(root, &doc);
    let want = [
        "src/model/clippy.toml: lacks the root clippy.toml's `std::time::Instant::now`",
        "src/model/clippy.toml: bans nothing under `std::println`",
        "src/act/Cargo.toml: missing",
        "src/guard/Cargo.toml: its tests use gpu-warden-act",
    ];
    exactly(&found, &want);
}

#[test]
fn a_file_missing_from_the_code_map_or_a_stale_name_in_it_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let w = |rel: &str, text: &str| write(root, rel, text);
    for f in [
        "src/guard/mod.rs",
        "src/guard/rank.rs",
        "src/guard/state/mod.rs",
        "src/guard/state/step.rs",
        "src/guard/state/outcomes_renamed.rs",
        "src/guard/new.rs",
        "src/config/mod.rs",
        "src/config/values.rs",
        "src/extra/mod.rs",
    ] {
        w(f, "\n");
    }
    let map = "# A\n## Code map\n\n### `src/guard/`\n`mod.rs`, `rank.rs` (ranking), `state/` (`mod.rs` \
               observations, `step.rs` triggers, `outcomes.rs` outcomes).\n\n### `src/config/`\n\
               The flags; `flag_values.rs` (the switch), `values.rs`, `mod.rs`.\n\n## Where to add\n\
               `ghost.rs` is not in the map.\n";
    let found = codemap::check(root, map);
    let want = [
        "the code map of src/guard/ names `outcomes.rs`, which is no file there",
        "the code map of src/config/ names `flag_values.rs`, which is no file there",
        "src/guard/state/outcomes_renamed.rs: not named",
        "src/guard/new.rs: not named",
        "src/extra/: no",
    ];
    exactly(&found, &want);
}
