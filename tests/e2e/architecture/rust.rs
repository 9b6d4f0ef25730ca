//! What one Rust file names, read with `syn` rather than by text: every path its non-test
//! code writes (in `use` trees, types, expressions, patterns, attributes and macro bodies),
//! resolved to where it points (`super::` climbed, `self::` and sibling modules prefixed,
//! `use` aliases and renamed crates followed), and how many of its lines are non-test code
//! wherever the test code sits. A text scan stops at the first `#[cfg(test)]` and misses
//! `super::super::act`, `use std::{fs, thread}` and `use ::tokio as rt`; this does not.

use proc_macro2::{Spacing, TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet};
use syn::spanned::Spanned;
use syn::visit::{self, Visit};

/// A path the non-test code names, resolved: `["crate", "guard", …]` for the crate's own
/// items, `["tokio", …]` or `["std", "fs", …]` for other crates.
#[derive(Debug, Clone)]
pub struct Named {
    pub path: Vec<String>,
    /// Where it is written (1-based).
    pub line: usize,
}

pub struct Facts {
    pub named: Vec<Named>,
    /// Where a `mod` takes its file from a `#[path]` (test code included): a file of
    /// another room's folder compiled into this one.
    pub path_mods: Vec<usize>,
    /// Lines that are neither test code nor comment-only.
    pub code_lines: usize,
}

/// The module path of a file under a crate's `src/` (`guard/state/step.rs` → `guard::state::step`,
/// `guard/mod.rs` → `guard`, `lib.rs` → the root).
pub fn module_of(rel: &str) -> Vec<String> {
    let mut m: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_string)
        .collect();
    if m.len() == 1 && (m[0] == "lib" || m[0] == "main") || m.last().is_some_and(|l| l == "mod") {
        m.pop();
    }
    m
}

/// `#[test]`, `#[cfg(test)]` or `#[cfg(all(test, …))]`: compiled only into tests. (`any(test,
/// feature = …)` is not: that feature builds it into the library.)
pub fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        if a.path().is_ident("test") {
            return true;
        }
        if !a.path().is_ident("cfg") {
            return false;
        }
        let Ok(list) = a.meta.require_list() else {
            return false;
        };
        let words: Vec<String> = list
            .tokens
            .to_string()
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect();
        match words.first().map(String::as_str) {
            Some("test") => words.len() == 1,
            Some("all") => words.iter().any(|w| w == "test") && !words.iter().any(|w| w == "not"),
            _ => false,
        }
    })
}

/// One leaf of a `use` tree: the path as written and the name it binds (`None` for a glob).
struct Leaf {
    segs: Vec<String>,
    leading_colon: bool,
    binds: Option<String>,
    line: usize,
}

fn leaves(tree: &syn::UseTree, prefix: &mut Vec<String>, lead: bool, out: &mut Vec<Leaf>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            leaves(&p.tree, prefix, lead, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            let mut segs = prefix.clone();
            if name != "self" {
                segs.push(name);
            }
            out.push(Leaf {
                binds: segs.last().cloned(),
                segs,
                leading_colon: lead,
                line: n.ident.span().start().line,
            });
        }
        syn::UseTree::Rename(r) => {
            let mut segs = prefix.clone();
            if r.ident != "self" {
                segs.push(r.ident.to_string());
            }
            out.push(Leaf {
                segs,
                leading_colon: lead,
                binds: Some(r.rename.to_string()).filter(|n| n != "_"),
                line: r.ident.span().start().line,
            });
        }
        syn::UseTree::Glob(g) => out.push(Leaf {
            segs: prefix.clone(),
            leading_colon: lead,
            binds: None,
            line: g.star_token.span.start().line,
        }),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                leaves(t, prefix, lead, out);
            }
        }
    }
}

/// Every leaf of a `use` item.
fn use_leaves(u: &syn::ItemUse) -> Vec<Leaf> {
    let mut out = Vec::new();
    leaves(
        &u.tree,
        &mut Vec::new(),
        u.leading_colon.is_some(),
        &mut out,
    );
    out
}

/// The names each module of the file binds with `use` or `extern crate`, and the child
/// modules it declares.
#[derive(Default)]
struct Scopes {
    /// (module, name) → (path as written, leading `::`, the module it was written in).
    aliases: BTreeMap<(Vec<String>, String), (Vec<String>, bool)>,
    children: BTreeSet<Vec<String>>,
    /// Lines of `mod` items with a `#[path]` attribute, test code included.
    path_mods: Vec<usize>,
}

struct Collect<'a> {
    module: Vec<String>,
    scopes: &'a mut Scopes,
}

impl<'ast> Visit<'ast> for Collect<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.attrs.iter().any(|a| a.path().is_ident("path")) {
            self.scopes.path_mods.push(m.ident.span().start().line);
        }
        self.module.push(m.ident.to_string());
        self.scopes.children.insert(self.module.clone());
        visit::visit_item_mod(self, m);
        self.module.pop();
    }
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        for l in use_leaves(u) {
            if let Some(b) = l.binds {
                self.scopes
                    .aliases
                    .insert((self.module.clone(), b), (l.segs, l.leading_colon));
            }
        }
    }
    fn visit_item_extern_crate(&mut self, e: &'ast syn::ItemExternCrate) {
        let name = e.ident.to_string();
        let binds = e
            .rename
            .as_ref()
            .map_or(name.clone(), |(_, r)| r.to_string());
        self.scopes
            .aliases
            .insert((self.module.clone(), binds), (vec![name], true));
    }
}

struct Check<'a> {
    /// The module of the file itself; scopes above it are other files'.
    base: usize,
    module: Vec<String>,
    scopes: &'a Scopes,
    named: Vec<Named>,
    test_lines: Vec<(usize, usize)>,
}

impl Check<'_> {
    /// Where `segs`, written in the current module, points (`None`: nowhere this check
    /// follows, such as `Self::`).
    fn resolve(&self, segs: &[String], leading_colon: bool, depth: u8) -> Option<Vec<String>> {
        let first = segs.first()?;
        if leading_colon {
            return Some(segs.to_vec());
        }
        let mut module = self.module.clone();
        let rest = match first.as_str() {
            "crate" => {
                module.clear();
                &segs[1..]
            }
            "self" => &segs[1..],
            "super" => {
                let ups = segs.iter().take_while(|s| *s == "super").count();
                for _ in 0..ups {
                    if module.pop().is_none() {
                        return Some(vec!["<above the crate root>".into()]);
                    }
                }
                &segs[ups..]
            }
            "Self" | "$crate" => return None,
            _ => {
                if depth < 8 {
                    for end in (self.base..=self.module.len()).rev() {
                        let key = (self.module[..end].to_vec(), first.clone());
                        if let Some((target, lead)) = self.scopes.aliases.get(&key) {
                            // The alias is written in the scope that declares it.
                            let inner = Check {
                                base: self.base,
                                module: key.0.clone(),
                                scopes: self.scopes,
                                named: Vec::new(),
                                test_lines: Vec::new(),
                            };
                            let mut t = inner.resolve(target, *lead, depth + 1)?;
                            t.extend(segs[1..].iter().cloned());
                            return Some(t);
                        }
                    }
                }
                // A room's crate by its package name (`gpu_warden_act::…`) is that room.
                if let Some(room) = first.strip_prefix("gpu_warden_") {
                    let mut out = vec!["crate".to_string(), room.to_string()];
                    out.extend(segs[1..].iter().cloned());
                    return Some(out);
                }
                let mut child = self.module.clone();
                child.push(first.clone());
                if !self.scopes.children.contains(&child) {
                    return Some(segs.to_vec());
                }
                segs
            }
        };
        let mut out = vec!["crate".to_string()];
        out.extend(module);
        out.extend(rest.iter().cloned());
        Some(out)
    }

    /// Records where `segs` points. A lone name that is no alias is a local item, a variable
    /// or a prelude name, and is left out unless a `use` (`use tokio;`) wrote it.
    fn name(&mut self, segs: &[String], leading_colon: bool, line: usize) {
        self.record(segs, leading_colon, line, false);
    }

    fn record(&mut self, segs: &[String], leading_colon: bool, line: usize, in_use: bool) {
        if let Some(path) = self.resolve(segs, leading_colon, 0) {
            if in_use || path.len() > 1 || leading_colon || segs != path.as_slice() {
                self.named.push(Named { path, line });
            }
        }
    }

    fn skip_test(&mut self, attrs: &[syn::Attribute], span: proc_macro2::Span) -> bool {
        let test = is_test(attrs);
        if test {
            let start = attrs
                .iter()
                .map(|a| a.pound_token.span.start().line)
                .min()
                .unwrap_or(usize::MAX)
                .min(span.start().line);
            self.test_lines.push((start, span.end().line));
        }
        test
    }

    /// Paths in a macro's tokens, which `syn` leaves unparsed: `a::b` runs of identifiers.
    fn scan(&mut self, tokens: TokenStream) {
        let tts: Vec<TokenTree> = tokens.into_iter().collect();
        let colons = |i: usize| {
            matches!((tts.get(i), tts.get(i + 1)),
                (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                    if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':')
        };
        let mut i = 0;
        while i < tts.len() {
            match &tts[i] {
                TokenTree::Group(g) => self.scan(g.stream()),
                TokenTree::Ident(id) => {
                    let lead = i >= 2
                        && colons(i - 2)
                        && !matches!(i.checked_sub(3).map(|k| &tts[k]), Some(TokenTree::Ident(_)));
                    let mut segs = vec![id.to_string()];
                    let line = id.span().start().line;
                    while colons(i + 1) {
                        match tts.get(i + 3) {
                            Some(TokenTree::Ident(next)) => {
                                segs.push(next.to_string());
                                i += 3;
                            }
                            _ => break,
                        }
                    }
                    if segs.len() > 1 || lead {
                        self.name(&segs, lead, line);
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item::*;
    match item {
        Const(i) => &i.attrs,
        Enum(i) => &i.attrs,
        ExternCrate(i) => &i.attrs,
        Fn(i) => &i.attrs,
        ForeignMod(i) => &i.attrs,
        Impl(i) => &i.attrs,
        Macro(i) => &i.attrs,
        Mod(i) => &i.attrs,
        Static(i) => &i.attrs,
        Struct(i) => &i.attrs,
        Trait(i) => &i.attrs,
        TraitAlias(i) => &i.attrs,
        Type(i) => &i.attrs,
        Union(i) => &i.attrs,
        Use(i) => &i.attrs,
        _ => &[],
    }
}

impl<'ast> Visit<'ast> for Check<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if self.skip_test(item_attrs(item), item.span()) {
            return;
        }
        match item {
            syn::Item::Mod(m) => {
                self.module.push(m.ident.to_string());
                visit::visit_item_mod(self, m);
                self.module.pop();
            }
            syn::Item::Use(u) => {
                for l in use_leaves(u) {
                    self.record(&l.segs, l.leading_colon, l.line, true);
                }
            }
            syn::Item::ExternCrate(e) => {
                let line = e.ident.span().start().line;
                self.record(&[e.ident.to_string()], true, line, true);
            }
            other => visit::visit_item(self, other),
        }
    }
    fn visit_impl_item(&mut self, i: &'ast syn::ImplItem) {
        let attrs: &[syn::Attribute] = match i {
            syn::ImplItem::Const(c) => &c.attrs,
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Type(t) => &t.attrs,
            syn::ImplItem::Macro(m) => &m.attrs,
            _ => &[],
        };
        if !self.skip_test(attrs, i.span()) {
            visit::visit_impl_item(self, i);
        }
    }
    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = p.span().start().line;
        self.name(&segs, p.leading_colon.is_some(), line);
        visit::visit_path(self, p);
    }
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        visit::visit_macro(self, m);
        self.scan(m.tokens.clone());
    }
}

/// Reads `text`, the file of module `module`.
pub fn facts(text: &str, module: &[String]) -> Result<Facts, String> {
    let file = syn::parse_file(text).map_err(|e| {
        format!(
            "does not parse at {}:{}: {e}",
            e.span().start().line,
            e.span().start().column
        )
    })?;
    let mut scopes = Scopes::default();
    Collect {
        module: module.to_vec(),
        scopes: &mut scopes,
    }
    .visit_file(&file);
    let mut check = Check {
        base: module.len(),
        module: module.to_vec(),
        scopes: &scopes,
        named: Vec::new(),
        test_lines: Vec::new(),
    };
    if is_test(&file.attrs) {
        check.test_lines.push((1, usize::MAX));
    } else {
        for item in &file.items {
            check.visit_item(item);
        }
    }
    let code_lines = text
        .lines()
        .enumerate()
        .filter(|(i, l)| {
            let n = i + 1;
            !l.trim_start().starts_with("//")
                && !check.test_lines.iter().any(|(a, b)| (*a..=*b).contains(&n))
        })
        .count();
    Ok(Facts {
        named: check.named,
        path_mods: scopes.path_mods.clone(),
        code_lines,
    })
}
