//! Every path written in prose points at something that exists, in the spirit of
//! rust-analyzer's tidy tests: a file or folder of the repository named in a comment (of a
//! Rust file or a TOML file) or in the docs (`README.md`, `docs/**/*.md`), and a module path
//! (`guard::rank`, `crate::model::clock::Clock`, `super::state`) written between backticks
//! there. A renamed file or module then fails here instead of leaving a pointer to nowhere.

use super::rules::{files, rel};
use super::rust::module_of;
use std::collections::BTreeSet;
use std::path::Path;
use syn::visit::{self, Visit};

/// The modules and item names of one crate, test code included (docs cite test paths).
#[derive(Default)]
pub struct Index {
    modules: BTreeSet<Vec<String>>,
    /// (module, name) of every item, `use` binding and `macro_rules!`.
    items: BTreeSet<(Vec<String>, String)>,
    /// Every name defined anywhere: items, fields, variants, associated items.
    members: BTreeSet<String>,
    /// `use …::*` items: (the module they are in, the path as written).
    globs: Vec<(Vec<String>, Vec<String>)>,
}

struct Indexer<'a> {
    module: Vec<String>,
    index: &'a mut Index,
}

impl Indexer<'_> {
    fn item(&mut self, name: String) {
        self.index.members.insert(name.clone());
        self.index.items.insert((self.module.clone(), name));
    }
}

impl<'ast> Visit<'ast> for Indexer<'_> {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        use syn::Item::*;
        let name = match i {
            Const(x) => Some(x.ident.to_string()),
            Enum(x) => Some(x.ident.to_string()),
            Fn(x) => Some(x.sig.ident.to_string()),
            Macro(x) => x.ident.as_ref().map(|i| i.to_string()),
            Static(x) => Some(x.ident.to_string()),
            Struct(x) => Some(x.ident.to_string()),
            Trait(x) => Some(x.ident.to_string()),
            Type(x) => Some(x.ident.to_string()),
            Union(x) => Some(x.ident.to_string()),
            Mod(x) => Some(x.ident.to_string()),
            _ => None,
        };
        if let Some(n) = name {
            self.item(n);
        }
        match i {
            Mod(m) => {
                self.module.push(m.ident.to_string());
                self.index.modules.insert(self.module.clone());
                visit::visit_item_mod(self, m);
                self.module.pop();
            }
            Use(u) => {
                fn binds(
                    t: &syn::UseTree,
                    prefix: &mut Vec<String>,
                    out: &mut Vec<String>,
                    globs: &mut Vec<Vec<String>>,
                ) {
                    match t {
                        syn::UseTree::Path(p) => {
                            prefix.push(p.ident.to_string());
                            binds(&p.tree, prefix, out, globs);
                            prefix.pop();
                        }
                        syn::UseTree::Name(n) => out.push(n.ident.to_string()),
                        syn::UseTree::Rename(r) => out.push(r.rename.to_string()),
                        syn::UseTree::Glob(_) => globs.push(prefix.clone()),
                        syn::UseTree::Group(g) => {
                            g.items.iter().for_each(|t| binds(t, prefix, out, globs))
                        }
                    }
                }
                let (mut out, mut globs) = (Vec::new(), Vec::new());
                binds(&u.tree, &mut Vec::new(), &mut out, &mut globs);
                out.into_iter().for_each(|n| self.item(n));
                for g in globs {
                    self.index.globs.push((self.module.clone(), g));
                }
            }
            other => visit::visit_item(self, other),
        }
    }
    fn visit_variant(&mut self, v: &'ast syn::Variant) {
        self.index.members.insert(v.ident.to_string());
        visit::visit_variant(self, v);
    }
    fn visit_field(&mut self, f: &'ast syn::Field) {
        if let Some(i) = &f.ident {
            self.index.members.insert(i.to_string());
        }
        visit::visit_field(self, f);
    }
    fn visit_impl_item(&mut self, i: &'ast syn::ImplItem) {
        match i {
            syn::ImplItem::Fn(f) => self.index.members.insert(f.sig.ident.to_string()),
            syn::ImplItem::Const(c) => self.index.members.insert(c.ident.to_string()),
            syn::ImplItem::Type(t) => self.index.members.insert(t.ident.to_string()),
            _ => false,
        };
        visit::visit_impl_item(self, i);
    }
    fn visit_trait_item(&mut self, i: &'ast syn::TraitItem) {
        match i {
            syn::TraitItem::Fn(f) => self.index.members.insert(f.sig.ident.to_string()),
            syn::TraitItem::Const(c) => self.index.members.insert(c.ident.to_string()),
            syn::TraitItem::Type(t) => self.index.members.insert(t.ident.to_string()),
            _ => false,
        };
        visit::visit_trait_item(self, i);
    }
}

impl Index {
    /// The crate whose files lie under `dir` (its root `lib.rs` or `main.rs`; `skip` left out).
    pub fn of(dir: &Path, skip: &[&str]) -> Index {
        let mut index = Index::default();
        index.modules.insert(Vec::new());
        for path in files(dir, ".rs") {
            let r = rel(dir, &path);
            if skip.contains(&r.as_str()) {
                continue;
            }
            let module = module_of(&r);
            for end in 1..=module.len() {
                index.modules.insert(module[..end].to_vec());
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if let Ok(file) = syn::parse_file(&text) {
                let mut ix = Indexer {
                    module,
                    index: &mut index,
                };
                for item in &file.items {
                    ix.visit_item(item);
                }
            }
        }
        index.follow_globs();
        index
    }

    /// Gives each module that globs another (`pub use values::*`) the other's items.
    fn follow_globs(&mut self) {
        for _ in 0..4 {
            let mut add = Vec::new();
            for (module, path) in &self.globs {
                let mut m = module.clone();
                let mut rest = path.as_slice();
                match rest.first().map(String::as_str) {
                    Some("crate") => {
                        m.clear();
                        rest = &rest[1..];
                    }
                    Some("self") => rest = &rest[1..],
                    _ => {}
                }
                while rest.first().is_some_and(|s| s == "super") {
                    m.pop();
                    rest = &rest[1..];
                }
                m.extend(rest.iter().cloned());
                if !self.modules.contains(&m) {
                    continue;
                }
                for (owner, name) in &self.items {
                    if *owner == m {
                        add.push((module.clone(), name.clone()));
                    }
                }
            }
            let before = self.items.len();
            self.items.extend(add);
            if self.items.len() == before {
                break;
            }
        }
    }

    fn top(&self, name: &str) -> bool {
        self.modules.contains(&vec![name.to_string()])
    }

    /// Whether `segs` (from the crate root) names a module, or an item of a module followed
    /// by names defined somewhere in the crate (`Core::on_full`, `Trigger::Hard`).
    fn has(&self, segs: &[String]) -> bool {
        let mut m: Vec<String> = Vec::new();
        let mut i = 0;
        while i < segs.len() {
            let mut next = m.clone();
            next.push(segs[i].clone());
            if !self.modules.contains(&next) {
                break;
            }
            m = next;
            i += 1;
        }
        if i == segs.len() {
            return true;
        }
        self.items.contains(&(m, segs[i].clone()))
            && segs[i + 1..].iter().all(|s| self.members.contains(s))
    }
}

/// A backticked word that reads as a Rust path (`a::b`), cleaned of call parentheses,
/// generics and trailing punctuation.
fn rust_path(word: &str) -> Option<Vec<String>> {
    let w = word.split(['<', '(', ' ', '{', '!']).next()?;
    let w = w
        .trim_end_matches("::*")
        .trim_end_matches(['.', ',', ':', ';']);
    let segs: Vec<String> = w.split("::").map(str::to_string).collect();
    let ident = |s: &String| {
        !s.is_empty()
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !s.starts_with(|c: char| c.is_ascii_digit())
    };
    (segs.len() > 1 && segs.iter().all(ident)).then_some(segs)
}

/// Where prose was found, and what its module paths are relative to.
pub struct Place<'a> {
    /// The file, relative to the repository.
    pub file: &'a str,
    /// The crate the file belongs to and its module, when its `crate::`/`super::` paths
    /// are checked; `None`: only paths rooted in a known crate are.
    pub module: Option<(&'a Index, Vec<String>)>,
}

pub struct Tidy<'a> {
    /// Every file and folder of the repository, relative to it.
    pub paths: BTreeSet<String>,
    pub top_dirs: BTreeSet<String>,
    /// gpu_warden's library and the integration-test crate.
    pub lib: &'a Index,
    pub e2e: &'a Index,
}

impl<'a> Tidy<'a> {
    pub fn new(root: &'a Path, lib: &'a Index, e2e: &'a Index) -> Self {
        let mut paths = BTreeSet::new();
        for f in files(root, "") {
            let r = rel(root, &f);
            let mut dir = r.as_str();
            while let Some((d, _)) = dir.rsplit_once('/') {
                paths.insert(d.to_string());
                dir = d;
            }
            paths.insert(r);
        }
        let top_dirs = paths
            .iter()
            .filter(|p| !p.contains('/') && root.join(p).is_dir())
            .cloned()
            .collect();
        Tidy {
            paths,
            top_dirs,
            lib,
            e2e,
        }
    }

    fn exists(&self, p: &str) -> bool {
        self.paths.contains(p.trim_end_matches('/'))
    }

    /// A word that reads as a file path and points nowhere, if it is one.
    fn stale_file(&self, word: &str, file: &str) -> Option<String> {
        if word.contains(['*', '<', '>', '{', '}', '$', '~'])
            || word.starts_with('/')
            || word.contains("//")
            || word.contains("..")
            || !word.contains('/')
        {
            return None;
        }
        let top = word.split('/').next().unwrap_or("");
        let rooted = self.top_dirs.contains(top);
        // Outside the repository's own folders only Rust files are taken for paths: a
        // `my-cluster/kustomization.yaml` in a how-to is the reader's file, not ours.
        if !rooted && !word.ends_with(".rs") {
            return None;
        }
        let dir = file.rsplit_once('/').map_or("", |(d, _)| d);
        // The package the file is in (`crates/x/…`), for crate-relative `src/…` paths.
        let package = file
            .strip_prefix("crates/")
            .and_then(|r| r.split_once('/'))
            .map(|(c, _)| format!("crates/{c}"));
        let mut tries = vec![
            word.to_string(),
            format!("{dir}/{word}"),
            format!("src/{word}"),
        ];
        if let Some(p) = &package {
            tries.push(format!("{p}/{word}"));
            tries.push(format!("{p}/src/{word}"));
        }
        if tries.iter().any(|t| self.exists(t)) {
            return None;
        }
        // A path inside a folder (`attribute/watch.rs`, `podresources/feed.rs`) may be
        // written from anywhere; one from the top (`src/…`, `docs/…`) may not.
        let tail = format!("/{}", word.trim_end_matches('/'));
        if !rooted && self.paths.iter().any(|p| p.ends_with(&tail)) {
            return None;
        }
        Some(format!("{file}: `{word}` does not exist"))
    }

    fn stale_rust(&self, word: &str, place: &Place) -> Option<String> {
        let mut segs = rust_path(word)?;
        let stale = || Some(format!("{}: `{word}` names nothing", place.file));
        if matches!(segs[0].as_str(), "crate" | "self" | "super") {
            let (index, module) = place.module.as_ref()?;
            let mut m = module.clone();
            if segs[0] == "crate" {
                m.clear();
            }
            while segs.first().is_some_and(|s| s == "super") {
                m.pop()?;
                segs.remove(0);
            }
            if segs.first().is_some_and(|s| s == "crate" || s == "self") {
                segs.remove(0);
            }
            m.extend(segs);
            return if index.has(&m) { None } else { stale() };
        }
        let (index, relative) = match segs[0].as_str() {
            "gpu_warden" => {
                segs.remove(0);
                (self.lib, false)
            }
            first if self.lib.top(first) => (self.lib, true),
            first if self.e2e.top(first) && place.module.is_none() => (self.e2e, false),
            _ => return None,
        };
        if index.has(&segs) {
            return None;
        }
        // In the crate's own comments a path may be written from the file's module.
        if let Some((ix, module)) = place.module.as_ref().filter(|_| relative) {
            for end in (0..=module.len()).rev() {
                let mut m = module[..end].to_vec();
                m.extend(segs.iter().cloned());
                if ix.has(&m) {
                    return None;
                }
            }
        }
        stale()
    }

    /// The stale pointers in `text`, prose found at `place`.
    pub fn check_prose(&self, text: &str, place: &Place, out: &mut Vec<String>) {
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || "_-./*<>{}$~".contains(c)))
        {
            let word = word
                .trim_start_matches(['.', '-'])
                .trim_end_matches(['.', ',', '-']);
            if let Some(f) = self.stale_file(word, place.file) {
                out.push(f);
            }
        }
        for word in text.split('`').skip(1).step_by(2) {
            if let Some(f) = self.stale_rust(word, place) {
                out.push(f);
            }
        }
    }
}

/// The comment text of a Rust or TOML file (`//`, `///`, `//!` or `#` lines and trailing
/// comments), one string per comment block, so a backticked path split over lines is kept.
pub fn comments(text: &str, hash: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut block = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        let body = if hash {
            t.strip_prefix('#').filter(|_| !t.starts_with("#["))
        } else {
            t.strip_prefix("//")
                .map(|b| b.trim_start_matches(['/', '!']))
                .or_else(|| {
                    // A trailing comment after code: `//` outside a string.
                    let i = line.find(" // ")?;
                    (line[..i].matches('"').count() % 2 == 0).then(|| &line[i + 4..])
                })
        };
        match body {
            Some(b) => {
                block.push_str(b);
                block.push('\n');
            }
            None if !block.is_empty() => out.push(std::mem::take(&mut block)),
            None => {}
        }
    }
    if !block.is_empty() {
        out.push(block);
    }
    out
}

/// Every stale pointer of the repository at `root`.
pub fn check(root: &Path) -> Vec<String> {
    let lib = Index::of(&root.join("src"), &["main.rs"]);
    let e2e = Index::of(&root.join("tests/e2e"), &[]);
    let tidy = Tidy::new(root, &lib, &e2e);
    let mut bad = Vec::new();
    for path in files(root, ".rs") {
        let file = rel(root, &path);
        // This test's own comments quote the violations it injects.
        if file.starts_with("tests/e2e/architecture/") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let module = if let Some(r) = file.strip_prefix("src/").filter(|r| *r != "main.rs") {
            Some((&lib, module_of(r)))
        } else {
            file.strip_prefix("tests/e2e/")
                .map(|r| (&e2e, module_of(r)))
        };
        let place = Place {
            file: &file,
            module,
        };
        for c in comments(&text, false) {
            tidy.check_prose(&c, &place, &mut bad);
        }
    }
    let prose = files(root, ".toml").into_iter().map(|p| (p, true)).chain(
        files(&root.join("docs"), ".md")
            .into_iter()
            // Records of past runs quote the commands as they were run then.
            .filter(|p| !p.starts_with(root.join("docs/evidence")))
            .chain([root.join("README.md")])
            .map(|p| (p, false)),
    );
    for (path, toml) in prose {
        let file = rel(root, &path);
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let place = Place {
            file: &file,
            module: None,
        };
        if toml {
            for c in comments(&text, true) {
                tidy.check_prose(&c, &place, &mut bad);
            }
        } else {
            tidy.check_prose(&text, &place, &mut bad);
        }
    }
    bad.sort();
    bad.dedup();
    bad
}
