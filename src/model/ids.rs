//! Stable identifiers: the one hash the project uses where it needs a deterministic,
//! well-spread number from names (generated UIDs, container IDs, backoff seeds).

/// A deterministic 64-bit FNV-1a hash, for generated UUIDs and IDs that stay the same
/// from run to run (golden files depend on it).
pub fn fnv64(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}
