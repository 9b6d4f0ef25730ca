//! The code map of docs/architecture.md against the files: every file of a room's folder is
//! named under that room's heading, and every file name written there is a file of that room.
//! Names in the map are short (`step.rs` under `state/`), so a rename or a new file is caught
//! here rather than by the path check of `tidy`, which reads only paths with a folder.

use super::rules::{files, rel};
use std::collections::BTreeSet;
use std::path::Path;

/// The backticked words of `text`, trimmed.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split('`').skip(1).step_by(2).map(str::trim)
}

/// Stale or missing names of the code map in `doc` (the page's text) over `root/src`.
pub fn check(root: &Path, doc: &str) -> Vec<String> {
    let mut bad = Vec::new();
    let Some(start) = doc.find("## Code map") else {
        return vec!["docs/architecture.md: no \"## Code map\" section".into()];
    };
    let map = &doc[start..];
    let map = &map[..map[2..].find("\n## ").map_or(map.len(), |e| e + 2)];
    let mut rooms = BTreeSet::new();
    for section in map.split("\n### ").skip(1) {
        let (head, body) = section.split_once('\n').unwrap_or((section, ""));
        let Some(room) = head
            .trim()
            .strip_prefix("`src/")
            .and_then(|h| h.strip_suffix("/`"))
        else {
            continue;
        };
        rooms.insert(room.to_string());
        let dir = root.join("src").join(room);
        let named: BTreeSet<&str> = words(body).filter(|w| w.ends_with(".rs")).collect();
        let dirs: BTreeSet<&str> = words(body)
            .filter(|w| w.ends_with('/') && !w.contains(' '))
            .collect();
        for name in &named {
            // A path into another room or the top of src/ is the path check's (tidy).
            if name.split_once('/').is_some_and(|(first, _)| {
                first != room && root.join("src").join(first).is_dir() && !dir.join(first).is_dir()
            }) || root.join("src").join(name).is_file()
            {
                continue;
            }
            let found =
                dir.join(name).is_file() || dirs.iter().any(|d| dir.join(d).join(name).is_file());
            if !found {
                bad.push(format!(
                    "docs/architecture.md: the code map of src/{room}/ names `{name}`, \
                     which is no file there"
                ));
            }
        }
        for path in files(&dir, ".rs") {
            let file = rel(&dir, &path);
            let listed = named.contains(file.as_str())
                || file.rsplit_once('/').is_some_and(|(d, base)| {
                    dirs.contains(format!("{d}/").as_str()) && named.contains(base)
                });
            if !listed {
                bad.push(format!(
                    "src/{room}/{file}: not named in docs/architecture.md's code map under \
                     `src/{room}/`"
                ));
            }
        }
    }
    for entry in std::fs::read_dir(root.join("src"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().is_dir() && !rooms.contains(&name) {
            bad.push(format!(
                "src/{name}/: no `### \\`src/{name}/\\`` section in docs/architecture.md's code map"
            ));
        }
    }
    bad
}
