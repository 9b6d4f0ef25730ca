//! A pod's declared VRAM: the annotation `<prefix>/vram-request-mib`, a whole number of MiB.
//! One rule for every reader — the guard ranks by it, the extender admits by it, the replica
//! view sums it per GPU and the job-peak tracker compares peaks with it — so a value one of
//! them accepts is never one another rejects.

/// The annotation key under `prefix` (`--annotation-prefix`, default `gpu-warden.io`).
pub fn key(prefix: &str) -> String {
    format!("{prefix}/vram-request-mib")
}

/// The MiB an annotation value declares; `None` when it is not a whole number of MiB
/// (surrounding blanks are ignored, units are not accepted: `"4Gi"` is not a declaration).
pub fn parse_mib(value: &str) -> Option<u64> {
    value.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_and_the_values_it_accepts() {
        assert_eq!(key("gpu-warden.io"), "gpu-warden.io/vram-request-mib");
        assert_eq!(key("example.com"), "example.com/vram-request-mib");
        assert_eq!(parse_mib("4096"), Some(4096));
        assert_eq!(parse_mib(" 0 "), Some(0));
        for bad in ["", "4Gi", "-1", "1.5", "0x10", "18446744073709551616"] {
            assert_eq!(parse_mib(bad), None, "{bad:?}");
        }
    }
}
