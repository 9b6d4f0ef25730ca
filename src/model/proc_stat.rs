//! The one rule for splitting a `/proc/<pid>/stat` line, which attribution (a process's start
//! time) and the agent's own `process_*` families both read.

/// The fields of a `/proc/<pid>/stat` line from field 3 (the state) on: field `n` of
/// proc(5) is item `n - 3`. The split is at the last `)`, because the command name (field 2)
/// is in parentheses and may itself hold spaces and parentheses. `None` without a `)`.
pub fn fields_after_name(stat: &str) -> Option<std::str::SplitAsciiWhitespace<'_>> {
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_ascii_whitespace())
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
