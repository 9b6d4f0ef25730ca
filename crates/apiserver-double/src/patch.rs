//! Patch semantics: JSON merge patch (RFC 7386) and JSON patch (RFC 6902).

use serde_json::{Map, Value};

/// Applies an RFC 7386 JSON merge patch in place: `null` deletes a key, objects merge
/// recursively, anything else (arrays included) replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Why a JSON patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonPatchError {
    /// The patch document is not an array of operation objects, or an operation lacks a member.
    #[error("malformed JSON patch: {0}")]
    Malformed(String),
    /// An operation names a path that does not exist or cannot be written.
    #[error("JSON patch operation {index} ({op}) failed: {reason}")]
    Failed {
        /// Position of the failing operation.
        index: usize,
        /// The operation name.
        op: String,
        /// What went wrong.
        reason: String,
    },
}

/// Applies an RFC 6902 JSON patch (`add`, `remove`, `replace`, `move`, `copy`, `test`)
/// atomically: on error, `target` is left unchanged.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), JsonPatchError> {
    let ops = patch
        .as_array()
        .ok_or_else(|| JsonPatchError::Malformed("the patch must be a JSON array".into()))?;
    let mut doc = target.clone();
    for (index, op) in ops.iter().enumerate() {
        let name = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or_else(|| JsonPatchError::Malformed(format!("operation {index} has no \"op\"")))?;
        let str_member = |m: &str| {
            op.get(m).and_then(Value::as_str).ok_or_else(|| {
                JsonPatchError::Malformed(format!("operation {index} ({name}) has no \"{m}\""))
            })
        };
        let value_member = || {
            op.get("value").cloned().ok_or_else(|| {
                JsonPatchError::Malformed(format!("operation {index} ({name}) has no \"value\""))
            })
        };
        let fail = |reason: String| JsonPatchError::Failed {
            index,
            op: name.to_string(),
            reason,
        };
        let path = str_member("path")?;
        match name {
            "add" => add(&mut doc, path, value_member()?).map_err(fail)?,
            "remove" => {
                remove(&mut doc, path).map_err(fail)?;
            }
            "replace" => {
                let v = value_member()?;
                let slot = pointer_mut(&mut doc, path)
                    .ok_or_else(|| fail(format!("path {path:?} does not exist")))?;
                *slot = v;
            }
            "move" => {
                let from = str_member("from")?;
                if path.starts_with(&format!("{from}/")) {
                    return Err(fail(format!("cannot move {from:?} into its own child")));
                }
                let v = remove(&mut doc, from).map_err(fail)?;
                add(&mut doc, path, v).map_err(fail)?;
            }
            "copy" => {
                let from = str_member("from")?;
                let v = pointer(&doc, from)
                    .cloned()
                    .ok_or_else(|| fail(format!("path {from:?} does not exist")))?;
                add(&mut doc, path, v).map_err(fail)?;
            }
            "test" => {
                let v = value_member()?;
                if pointer(&doc, path) != Some(&v) {
                    return Err(fail(format!(
                        "value at {path:?} differs from the expected one"
                    )));
                }
            }
            other => {
                return Err(JsonPatchError::Malformed(format!(
                    "operation {index} has unknown op {other:?}"
                )))
            }
        }
    }
    *target = doc;
    Ok(())
}

/// Splits a JSON pointer into unescaped reference tokens; `None` when malformed.
fn tokens(path: &str) -> Option<Vec<String>> {
    if path.is_empty() {
        return Some(Vec::new());
    }
    let rest = path.strip_prefix('/')?;
    Some(
        rest.split('/')
            .map(|t| t.replace("~1", "/").replace("~0", "~"))
            .collect(),
    )
}

fn array_index(token: &str, len: usize, allow_end: bool) -> Option<usize> {
    if token == "-" && allow_end {
        return Some(len);
    }
    if token.is_empty() || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    if !token.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let i: usize = token.parse().ok()?;
    let max = if allow_end {
        len
    } else {
        len.saturating_sub(1)
    };
    (i <= max && (allow_end || len > 0)).then_some(i)
}

fn pointer<'a>(doc: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = doc;
    for t in tokens(path)? {
        cur = match cur {
            Value::Object(m) => m.get(&t)?,
            Value::Array(a) => a.get(array_index(&t, a.len(), false)?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn pointer_mut<'a>(doc: &'a mut Value, path: &str) -> Option<&'a mut Value> {
    let mut cur = doc;
    for t in tokens(path)? {
        cur = match cur {
            Value::Object(m) => m.get_mut(&t)?,
            Value::Array(a) => {
                let i = array_index(&t, a.len(), false)?;
                a.get_mut(i)?
            }
            _ => return None,
        };
    }
    Some(cur)
}

/// Splits a pointer into (parent pointer, last token).
fn split_last(path: &str) -> Result<(String, String), String> {
    let toks = tokens(path).ok_or_else(|| format!("malformed path {path:?}"))?;
    match path.rfind('/') {
        Some(pos) => Ok((
            path[..pos].to_string(),
            toks.last().cloned().unwrap_or_default(),
        )),
        None => Err(format!("malformed path {path:?}")),
    }
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, last) = split_last(path)?;
    let container =
        pointer_mut(doc, &parent).ok_or_else(|| format!("parent of {path:?} does not exist"))?;
    match container {
        Value::Object(m) => {
            m.insert(last, value);
            Ok(())
        }
        Value::Array(a) => {
            let i = array_index(&last, a.len(), true)
                .ok_or_else(|| format!("bad array index in {path:?}"))?;
            a.insert(i, value);
            Ok(())
        }
        _ => Err(format!("parent of {path:?} is not a container")),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    if path.is_empty() {
        return Err("cannot remove the whole document".into());
    }
    let (parent, last) = split_last(path)?;
    let container =
        pointer_mut(doc, &parent).ok_or_else(|| format!("parent of {path:?} does not exist"))?;
    match container {
        Value::Object(m) => m
            .remove(&last)
            .ok_or_else(|| format!("path {path:?} does not exist")),
        Value::Array(a) => {
            let i = array_index(&last, a.len(), false)
                .ok_or_else(|| format!("bad array index in {path:?}"))?;
            Ok(a.remove(i))
        }
        _ => Err(format!("parent of {path:?} is not a container")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rfc7386_examples() {
        // the test cases from RFC 7386 appendix A
        let cases = [
            (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
            (json!({"a":"b"}), json!({"a":null}), json!({})),
            (
                json!({"a":"b","b":"c"}),
                json!({"a":null}),
                json!({"b":"c"}),
            ),
            (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
            (
                json!({"a":{"b":"c"}}),
                json!({"a":{"b":"d","c":null}}),
                json!({"a":{"b":"d"}}),
            ),
            (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a":"b"}), json!(["c"]), json!(["c"])),
            (json!({"a":"foo"}), json!(null), json!(null)),
            (json!({"a":"foo"}), json!("bar"), json!("bar")),
            (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
            (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
            (
                json!({}),
                json!({"a":{"bb":{"ccc":null}}}),
                json!({"a":{"bb":{}}}),
            ),
        ];
        for (mut target, patch, want) in cases {
            merge_patch(&mut target, &patch);
            assert_eq!(target, want, "patch {patch}");
        }
    }

    #[test]
    fn rfc6902_operations() {
        let mut doc =
            json!({"metadata": {"annotations": {"a/b": "1", "keep": "x"}}, "list": [1, 2]});
        json_patch(
            &mut doc,
            &json!([
                {"op": "test", "path": "/metadata/annotations/a~1b", "value": "1"},
                {"op": "replace", "path": "/metadata/annotations/a~1b", "value": "2"},
                {"op": "add", "path": "/metadata/annotations/new", "value": "n"},
                {"op": "remove", "path": "/metadata/annotations/keep"},
                {"op": "add", "path": "/list/-", "value": 3},
                {"op": "add", "path": "/list/0", "value": 0},
                {"op": "copy", "from": "/list/3", "path": "/copied"},
                {"op": "move", "from": "/copied", "path": "/moved"}
            ]),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"metadata": {"annotations": {"a/b": "2", "new": "n"}}, "list": [0, 1, 2, 3], "moved": 3})
        );

        let before = doc.clone();
        let err = json_patch(
            &mut doc,
            &json!([
                {"op": "add", "path": "/x", "value": 1},
                {"op": "test", "path": "/moved", "value": 4}
            ]),
        );
        assert!(matches!(err, Err(JsonPatchError::Failed { index: 1, .. })));
        assert_eq!(doc, before, "a failed patch changes nothing");
        assert!(json_patch(&mut doc, &json!([{"op": "remove", "path": "/nope"}])).is_err());
        assert!(json_patch(
            &mut doc,
            &json!([{"op": "replace", "path": "/nope", "value": 1}])
        )
        .is_err());
        assert!(json_patch(&mut doc, &json!({"op": "add"})).is_err());
        assert!(json_patch(&mut doc, &json!([{"op": "frob", "path": "/x"}])).is_err());
    }
}
