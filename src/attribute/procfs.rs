//! Reading `/proc/<pid>` under a configurable root (`--proc-root`, for a host `/proc`
//! mounted elsewhere). The parsing is pure and tested on its own; the reads are a thin
//! shell that turns "cannot read" into [`ProcError`] instead of failing the poll.

use crate::model::proc_stat::{fields_after_name, ProcError};
use std::path::{Path, PathBuf};

/// Largest file read from `/proc/<pid>`: real `cgroup` and `stat` files are well under
/// 4 KiB; a bigger one is not trusted and not read whole.
const MAX_PROC_FILE: u64 = 64 * 1024;

/// The process start time (`starttime`, field 22 of `/proc/<pid>/stat`, clock ticks since
/// boot). With the pid it identifies a process across pid reuse.
pub fn parse_start_time(stat: &str) -> Result<u64, StatError> {
    let field = fields_after_name(stat)
        .ok_or(StatError::NoName)?
        .nth(19)
        .ok_or(StatError::TooFewFields)?;
    field
        .parse::<u64>()
        .map_err(|_| StatError::StartTime(field.to_string()))
}

/// A `/proc/<pid>/stat` line that does not have the shape the kernel writes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatError {
    #[error("no ')' after the command name")]
    NoName,
    #[error("fewer than 22 fields")]
    TooFewFields,
    #[error("starttime {0:?} is not a number")]
    StartTime(String),
}

/// Which `/proc/<pid>` directory this is: its inode number and change time.
///
/// procfs makes a new inode, with a new number and the current time, for each process it
/// shows, so a reused pid has a new entry; the same entry is the same process, and one
/// `stat` of the directory answers that without opening and rendering `/proc/<pid>/stat`
/// (which walks every thread of a CUDA process). The converse does not hold: the kernel may
/// drop and remake an idle process's inode, so a changed entry is checked against the start
/// time before it is believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryId {
    ino: u64,
    ctime: (i64, i64),
}

/// Reads files of `/proc/<pid>` under a root.
#[derive(Debug, Clone)]
pub struct ProcFs {
    root: PathBuf,
}

impl ProcFs {
    /// A reader for `root` (normally `/proc`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ProcFs { root: root.into() }
    }

    /// The root being read.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn read(&self, pid: u32, file: &'static str) -> Result<String, ProcError> {
        use std::io::Read;
        let path = self.root.join(pid.to_string()).join(file);
        let f = std::fs::File::open(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                ProcError::Missing(pid)
            } else {
                ProcError::Unreadable {
                    pid,
                    file,
                    message: e.to_string(),
                }
            }
        })?;
        let mut buf = Vec::new();
        f.take(MAX_PROC_FILE)
            .read_to_end(&mut buf)
            .map_err(|e| ProcError::Unreadable {
                pid,
                file,
                message: e.to_string(),
            })?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// The identity of the `/proc/<pid>` directory, see [`EntryId`].
    pub fn entry(&self, pid: u32) -> Result<EntryId, ProcError> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(self.root.join(pid.to_string())).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                ProcError::Missing(pid)
            } else {
                ProcError::Unreadable {
                    pid,
                    file: ".",
                    message: e.to_string(),
                }
            }
        })?;
        Ok(EntryId {
            ino: m.ino(),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }

    /// The process start time, see [`parse_start_time`].
    pub fn start_time(&self, pid: u32) -> Result<u64, ProcError> {
        let stat = self.read(pid, "stat")?;
        parse_start_time(&stat).map_err(|e| ProcError::Malformed {
            pid,
            file: "stat",
            message: e.to_string(),
        })
    }

    /// The text of `/proc/<pid>/cgroup`.
    pub fn cgroup(&self, pid: u32) -> Result<String, ProcError> {
        self.read(pid, "cgroup")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (python3) S 1 4242 4242 0 -1 4194560 12345 0 0 0 100 20 0 0 20 0 8 0 987654 123456789 1000 18446744073709551615 1 1 0 0 0 0 0 16781312 17410 0 0 0 17 3 0 0 0 0 0";

    #[test]
    fn start_time_is_field_22() {
        assert_eq!(parse_start_time(STAT), Ok(987654));
    }

    #[test]
    fn command_names_with_spaces_and_parens_do_not_shift_fields() {
        let hostile = STAT.replace("(python3)", "(evil) 1 2 3 (x)");
        assert_eq!(parse_start_time(&hostile), Ok(987654));
    }

    #[test]
    fn malformed_stat_is_an_error_not_a_panic() {
        assert!(parse_start_time("").is_err());
        assert!(parse_start_time("12 (x) S 1").is_err());
        assert!(parse_start_time("12 x S").is_err());
        let bad = STAT.replace("987654", "soon");
        assert!(parse_start_time(&bad).is_err());
    }

    #[test]
    fn reads_under_a_root_and_reports_missing_pids() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("77")).unwrap();
        std::fs::write(dir.path().join("77/stat"), STAT).unwrap();
        std::fs::write(dir.path().join("77/cgroup"), "0::/init.scope\n").unwrap();
        let fs = ProcFs::new(dir.path());
        assert_eq!(fs.start_time(77), Ok(987654));
        assert_eq!(fs.cgroup(77).unwrap(), "0::/init.scope\n");
        assert_eq!(fs.start_time(78), Err(ProcError::Missing(78)));
        assert_eq!(fs.entry(78), Err(ProcError::Missing(78)));
    }

    #[test]
    fn an_entry_is_its_directory_not_its_pid() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("77")).unwrap();
        std::fs::write(dir.path().join("77/stat"), STAT).unwrap();
        let fs = ProcFs::new(dir.path());
        let first = fs.entry(77).unwrap();
        std::fs::write(dir.path().join("77/stat"), "changed").unwrap();
        assert_eq!(
            fs.entry(77),
            Ok(first),
            "a file rewritten inside does not change it"
        );
        // A new directory made while the old one exists, then put in its place: as procfs
        // does for a reused pid, a new inode.
        std::fs::create_dir(dir.path().join("77.new")).unwrap();
        std::fs::remove_dir_all(dir.path().join("77")).unwrap();
        std::fs::rename(dir.path().join("77.new"), dir.path().join("77")).unwrap();
        assert_ne!(fs.entry(77).unwrap(), first);
    }

    /// The property the attributor relies on, on the real procfs: the same process keeps its
    /// entry, a different process has another (here: this process and its parent).
    #[test]
    fn procfs_entries_are_stable_and_distinct() {
        let fs = ProcFs::new("/proc");
        let me = std::process::id();
        let Ok(first) = fs.entry(me) else {
            return; // no procfs on this platform
        };
        assert_eq!(fs.entry(me), Ok(first));
        let parent = std::os::unix::process::parent_id();
        if let Ok(other) = fs.entry(parent) {
            assert_ne!(other, first);
        }
    }

    #[test]
    fn huge_files_are_truncated_not_slurped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("5")).unwrap();
        std::fs::write(dir.path().join("5/cgroup"), "x".repeat(1 << 20)).unwrap();
        let got = ProcFs::new(dir.path()).cgroup(5).unwrap();
        assert_eq!(got.len() as u64, MAX_PROC_FILE);
    }
}
