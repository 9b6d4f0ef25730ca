//! The one rule for splitting a `/proc/<pid>/stat` line, which attribution (a process's start
//! time) and the agent's own `process_*` families both read; and [`ProcError`], why a
//! process's entry could not be used, here so that the pure rooms that judge a pid (the
//! guard's stop check, the stopper's port) can name it without naming the `/proc` shell.

/// The fields of a `/proc/<pid>/stat` line from field 3 (the state) on: field `n` of
/// proc(5) is item `n - 3`. The split is at the last `)`, because the command name (field 2)
/// is in parentheses and may itself hold spaces and parentheses. `None` without a `)`.
pub fn fields_after_name(stat: &str) -> Option<std::str::SplitAsciiWhitespace<'_>> {
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_ascii_whitespace())
}

/// Why a process's entry could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcError {
    /// No such pid under the proc root: another PID namespace (no `hostPID: true`), or it exited.
    #[error("/proc/{0} does not exist under the proc root")]
    Missing(u32),
    /// The entry exists but cannot be read.
    #[error("/proc/{pid}/{file}: {message}")]
    Unreadable {
        pid: u32,
        file: &'static str,
        message: String,
    },
    /// The content did not parse.
    #[error("/proc/{pid}/{file}: malformed ({message})")]
    Malformed {
        pid: u32,
        file: &'static str,
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_spaces_and_parentheses_do_not_shift_the_fields() {
        let stat = "42 (evil) 1 2 3 (x)) S 1 42 42 0 -1 4194560";
        let fields: Vec<&str> = fields_after_name(stat).unwrap().collect();
        assert_eq!(fields[0], "S", "field 3");
        assert_eq!(fields[1], "1", "field 4");
        assert!(fields_after_name("42 (x").is_none());
        assert_eq!(fields_after_name("42 (x)").unwrap().count(), 0);
    }
}
