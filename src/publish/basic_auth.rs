//! HTTP Basic auth against `basic_auth_users` of the web config file (bcrypt hashes), as
//! exporter-toolkit's web/handler.go checks it: an unknown user is checked against a fixed
//! hash so the time does not tell which users exist; one bcrypt comparison runs at a time
//! (each costs tens of milliseconds at cost 10); verdicts are cached for up to 100
//! (user, hash, password) triples, so Prometheus's scrapes every few seconds cost one bcrypt
//! run per credential, not one per scrape. The cache keys are SHA-256 digests, never the
//! password itself, and a changed hash in the file is a new key.

use base64::Engine;
use ring::digest::{Context, SHA256};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// exporter-toolkit's stand-in for an unknown user: bcrypt of "fakepassword", cost 10.
const DUMMY_HASH: &str = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";

/// Most cached verdicts (exporter-toolkit's cacheSize).
const CACHE_SIZE: usize = 100;

/// The verdict cache and the lock that keeps bcrypt runs one at a time.
#[derive(Debug, Default)]
pub struct BasicAuthChecker {
    cache: Mutex<HashMap<[u8; 32], bool>>,
    bcrypt: Mutex<()>,
}

/// User and password of a `Basic` header, or None when it is not one.
fn credentials(header: Option<&str>) -> Option<(String, Vec<u8>)> {
    let value = header?;
    let (scheme, cred) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(cred.trim())
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((user, decoded[colon + 1..].to_vec()))
}

fn key(user: &str, hash: &str, pass: &[u8]) -> [u8; 32] {
    let mut c = Context::new(&SHA256);
    // Lengths first, so no two triples share a byte string.
    for part in [user.as_bytes(), hash.as_bytes(), pass] {
        c.update(&(part.len() as u64).to_le_bytes());
        c.update(part);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(c.finish().as_ref());
    out
}

impl BasicAuthChecker {
    /// Whether `header` names a user of `users` with the right password. May run bcrypt:
    /// call it off the async runtime's workers.
    pub fn check(&self, users: &BTreeMap<String, String>, header: Option<&str>) -> bool {
        let Some((user, pass)) = credentials(header) else {
            return false;
        };
        let (hash, known) = match users.get(&user) {
            Some(h) => (h.as_str(), true),
            None => (DUMMY_HASH, false),
        };
        let k = key(&user, hash, &pass);
        if let Some(ok) = self.cache.lock().ok().and_then(|c| c.get(&k).copied()) {
            return ok && known;
        }
        let ok = {
            let _one_at_a_time = self.bcrypt.lock();
            bcrypt::verify(&pass, hash).unwrap_or(false)
        } && known;
        if let Ok(mut c) = self.cache.lock() {
            if c.len() >= CACHE_SIZE {
                // exporter-toolkit evicts at random; any entry will do.
                if let Some(first) = c.keys().next().copied() {
                    c.remove(&first);
                }
            }
            c.insert(k, ok);
        }
        ok
    }

    /// Whether the verdict for `header` is cached (a check then costs no bcrypt run).
    pub fn is_cached(&self, users: &BTreeMap<String, String>, header: Option<&str>) -> bool {
        let Some((user, pass)) = credentials(header) else {
            return true; // refused at once, no bcrypt
        };
        let hash = users.get(&user).map_or(DUMMY_HASH, String::as_str);
        let k = key(&user, hash, &pass);
        self.cache.lock().is_ok_and(|c| c.contains_key(&k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(s: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(s)
        )
    }

    #[test]
    fn checks_bcrypt_hashes_and_caches_the_verdicts() {
        // Cost 4, the least bcrypt allows, keeps the test fast; the check is the same.
        let users = BTreeMap::from([
            ("prometheus".to_string(), bcrypt::hash("s3cret", 4).unwrap()),
            ("other".to_string(), bcrypt::hash("pw2", 4).unwrap()),
        ]);
        let a = BasicAuthChecker::default();
        let good = basic("prometheus:s3cret");
        assert!(!a.is_cached(&users, Some(good.as_str())));
        assert!(a.check(&users, Some(good.as_str())));
        assert!(a.is_cached(&users, Some(good.as_str())));
        assert!(
            a.check(&users, Some(good.as_str())),
            "a cached verdict is the same"
        );
        assert!(!a.check(&users, Some(basic("prometheus:s3cre").as_str())));
        assert!(!a.check(&users, Some(basic("other:s3cret").as_str())));
        // An unknown user is refused even with the dummy hash's own password.
        assert!(!a.check(&users, Some(basic("nobody:fakepassword").as_str())));
        assert!(!a.check(&users, Some("Bearer s3cret")));
        assert!(!a.check(&users, None));
        // A new hash for the user in the file: the old password's cached yes does not count.
        let changed = BTreeMap::from([("prometheus".to_string(), bcrypt::hash("new", 4).unwrap())]);
        assert!(!a.check(&changed, Some(good.as_str())));
        assert!(a.check(&changed, Some(basic("prometheus:new").as_str())));
    }

    #[test]
    fn the_cache_stays_bounded() {
        let users = BTreeMap::from([("u".to_string(), bcrypt::hash("p", 4).unwrap())]);
        let a = BasicAuthChecker::default();
        for i in 0..CACHE_SIZE + 5 {
            a.check(&users, Some(basic(&format!("u:wrong{i}")).as_str()));
        }
        assert!(a.cache.lock().unwrap().len() <= CACHE_SIZE);
        assert!(a.check(&users, Some(basic("u:p").as_str())));
    }
}
