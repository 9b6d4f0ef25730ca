//! The replies the server writes, serialized straight from the call and its verdicts: the
//! names are borrowed from the request, a refused node's reason is written into the body as
//! it is formatted, and nothing is copied per node. The bytes are those of the owned wire
//! types ([`ExtenderFilterResult`], [`HostPriority`]), which the simulation and the tests
//! read (checked below and by `tests/e2e/extender_wire.rs`).
//!
//! [`ExtenderFilterResult`]: super::wire::ExtenderFilterResult
//! [`HostPriority`]: super::wire::HostPriority

use super::core::{Candidates, Evaluation};
use super::judge::{score, ScoreMode, Why};
use super::wire::node_name;
use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Serialize, Serializer};
use serde_json::Value;

/// The filter reply of one call, borrowing it.
pub struct FilterReply<'a> {
    candidates: &'a Candidates,
    e: &'a Evaluation,
    /// Indices of the refused candidates, by name (a map's order in the owned type), a name
    /// sent twice once (its last verdict, as the owned map keeps).
    refused: Vec<usize>,
}

/// A candidate's name, as the owned reply reads it.
fn name_of(candidates: &Candidates, i: usize) -> &str {
    match candidates {
        Candidates::Names(n) => &n[i],
        Candidates::Objects(l) => node_name(&l.items[i]).unwrap_or_default(),
    }
}

/// The filter reply for `e`, judged on `candidates`.
pub fn filter_reply<'a>(candidates: &'a Candidates, e: &'a Evaluation) -> FilterReply<'a> {
    let mut refused: Vec<usize> = (0..e.verdicts.len())
        .filter(|i| !e.verdicts[*i].pass)
        .collect();
    // Stable: of a name sent twice the later verdict comes last, and is the one kept.
    refused.sort_by(|a, b| name_of(candidates, *a).cmp(name_of(candidates, *b)));
    refused.dedup_by(|later, earlier| {
        let same = name_of(candidates, *later) == name_of(candidates, *earlier);
        if same {
            *earlier = *later;
        }
        same
    });
    FilterReply {
        candidates,
        e,
        refused,
    }
}

/// A reason, written as it is formatted.
struct Prose<'a>(&'a Why);

impl Serialize for Prose<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self.0)
    }
}

struct Refused<'a>(&'a FilterReply<'a>);

impl Serialize for Refused<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.0;
        let mut m = s.serialize_map(Some(r.refused.len()))?;
        for i in &r.refused {
            m.serialize_entry(name_of(r.candidates, *i), &Prose(&r.e.verdicts[*i].why))?;
        }
        m.end()
    }
}

/// The passed nodes as full objects (`NodeList`'s shape).
#[derive(Serialize)]
struct PassedObjects<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<&'a Value>,
    items: Vec<&'a Value>,
}

struct Empty;

impl Serialize for Empty {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_map(Some(0))?.end()
    }
}

impl Serialize for FilterReply<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let passed = (0..self.e.verdicts.len()).filter(|i| self.e.verdicts[*i].pass);
        let mut st = s.serialize_struct("ExtenderFilterResult", 5)?;
        match self.candidates {
            Candidates::Names(n) => {
                st.serialize_field("Nodes", &None::<()>)?;
                let names: Vec<&str> = passed.map(|i| n[i].as_str()).collect();
                st.serialize_field("NodeNames", &Some(names))?;
            }
            Candidates::Objects(list) => {
                let objects = PassedObjects {
                    metadata: list.metadata.as_ref(),
                    items: passed.map(|i| &list.items[i]).collect(),
                };
                st.serialize_field("Nodes", &Some(objects))?;
                st.serialize_field("NodeNames", &None::<()>)?;
            }
        }
        st.serialize_field("FailedNodes", &Empty)?;
        st.serialize_field("FailedAndUnresolvableNodes", &Refused(self))?;
        st.serialize_field("Error", "")?;
        st.end()
    }
}

/// One entry of the prioritize reply, borrowing the node's name.
#[derive(Serialize)]
pub struct HostScore<'a> {
    /// The node name.
    #[serde(rename = "Host")]
    pub host: &'a str,
    /// 0..=10.
    #[serde(rename = "Score")]
    pub score: i64,
}

/// The prioritize reply for `names` (the candidates' order) and their verdicts.
pub fn prioritize_reply<'a>(
    names: impl IntoIterator<Item = &'a str>,
    e: &Evaluation,
    mode: ScoreMode,
) -> Vec<HostScore<'a>> {
    names
        .into_iter()
        .zip(&e.verdicts)
        .map(|(host, v)| HostScore {
            host,
            score: score(v, mode),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extender::core::{filter_result, Evaluation};
    use crate::extender::judge::{priorities, Reason, Verdict, Which};
    use crate::extender::wire::NodeList;
    use serde_json::json;

    fn verdict(pass: bool, index: u32) -> Verdict {
        let which = Which {
            index,
            known_next: true,
            count: 1,
            node_gpus: 1,
        };
        Verdict {
            pass,
            reason: if pass { Reason::Fits } else { Reason::NoRoom },
            why: if pass {
                Why::Fits {
                    which,
                    after_mib: 3000,
                }
            } else {
                Why::Short {
                    which,
                    free_mib: 2048,
                    committed_mib: 1024,
                    need_mib: 8192,
                    margin_mib: 512,
                    short_mib: 7680,
                }
            },
            gpu: None,
        }
    }

    #[test]
    fn writes_the_bytes_the_owned_replies_write() {
        // Out of order, one name twice (refused, then passed, then refused again), a quote.
        let names = ["n-b", "n-a", "n\"q", "n-a", "n-c", "n-a"];
        let pass = [false, false, false, true, true, false];
        let e = Evaluation {
            need: None,
            gpus: 1,
            verdicts: pass
                .iter()
                .enumerate()
                .map(|(i, p)| verdict(*p, i as u32))
                .collect(),
        };
        let by_name = Candidates::Names(names.iter().map(|s| s.to_string()).collect());
        let objects = Candidates::Objects(NodeList {
            metadata: Some(json!({})),
            items: names
                .iter()
                .map(|n| json!({"metadata": {"name": n}, "spec": {}}))
                .collect(),
        });
        for c in [by_name, objects] {
            assert_eq!(
                serde_json::to_string(&filter_reply(&c, &e)).unwrap(),
                serde_json::to_string(&filter_result(&c, &e)).unwrap()
            );
        }
        for mode in [ScoreMode::Pack, ScoreMode::Spread] {
            assert_eq!(
                serde_json::to_string(&prioritize_reply(names, &e, mode)).unwrap(),
                serde_json::to_string(&priorities(names.into_iter().zip(&e.verdicts), mode))
                    .unwrap()
            );
        }
    }
}
