//! The JSON Schema of every kind of report `-o json` prints
//! (`cnilab schema KIND`), from `harness/schemas/<KIND>.json`, and of the
//! documents that are not reports ([`DOCUMENTS`]: `cnilab schema capture`,
//! `cnilab schema trace`), and
//! [`validate`]: a validator for the part of JSON Schema those files use
//! (`type`, `const`, `enum`, `properties`, `required`, `items`), so tests
//! check real reports against the published schemas.

use serde_json::Value;

/// Every kind [`super::json`] is called with, and its schema.
pub const KINDS: &[(&str, &str)] = &[
    (
        "BenchReport",
        include_str!("../../schemas/BenchReport.json"),
    ),
    ("CauseList", include_str!("../../schemas/CauseList.json")),
    (
        "ConformReport",
        include_str!("../../schemas/ConformReport.json"),
    ),
    ("LabReport", include_str!("../../schemas/LabReport.json")),
    ("LabStatus", include_str!("../../schemas/LabStatus.json")),
    ("PerfReport", include_str!("../../schemas/PerfReport.json")),
    (
        "MatrixReport",
        include_str!("../../schemas/MatrixReport.json"),
    ),
    (
        "LifecycleReport",
        include_str!("../../schemas/LifecycleReport.json"),
    ),
    (
        "ScenarioList",
        include_str!("../../schemas/ScenarioList.json"),
    ),
    (
        "ScenarioReport",
        include_str!("../../schemas/ScenarioReport.json"),
    ),
    ("SoakReport", include_str!("../../schemas/SoakReport.json")),
    (
        "SweepReport",
        include_str!("../../schemas/SweepReport.json"),
    ),
];

/// cnilab's own files that are not reports (no `kind` field, their own
/// `schemaVersion`): a `cnilab capture` file, a `lab trace -o json`.
pub const DOCUMENTS: &[(&str, &str)] = &[
    ("capture", include_str!("../../schemas/Capture.json")),
    ("trace", include_str!("../../schemas/Trace.json")),
];

/// The schema of report kind or document `kind` (its text), if there is one.
pub fn schema(kind: &str) -> Option<&'static str> {
    KINDS
        .iter()
        .chain(DOCUMENTS)
        .find(|(k, _)| *k == kind)
        .map(|(_, s)| *s)
}

/// What is wrong with `doc` against the schema of its own `kind` field:
/// one line per violation, empty when it conforms.
pub fn check_report(doc: &Value) -> Vec<String> {
    let Some(kind) = doc.get("kind").and_then(Value::as_str) else {
        return vec!["/: no \"kind\" field".to_string()];
    };
    let Some(text) = schema(kind) else {
        return vec![format!("/kind: no schema for kind {kind:?}")];
    };
    match serde_json::from_str::<Value>(text) {
        Ok(s) => validate(&s, doc),
        Err(e) => vec![format!("schema of {kind}: {e}")],
    }
}

/// What is wrong with `doc` against `schema`, one line per violation, each
/// starting with the JSON pointer of the value at fault.
pub fn validate(schema: &Value, doc: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(schema, doc, "", &mut out);
    out
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(want: &str, v: &Value) -> bool {
    let got = type_name(v);
    got == want || (want == "number" && got == "integer")
}

fn walk(schema: &Value, doc: &Value, at: &str, out: &mut Vec<String>) {
    let here = if at.is_empty() { "/" } else { at };
    if let Some(want) = schema.get("type") {
        let wants: Vec<&str> = match want {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !wants.iter().any(|w| type_matches(w, doc)) {
            out.push(format!(
                "{here}: {} where the schema wants {}",
                type_name(doc),
                wants.join(" or ")
            ));
            return;
        }
    }
    if let Some(c) = schema.get("const") {
        if c != doc {
            out.push(format!("{here}: {doc} where the schema wants {c}"));
        }
    }
    if let Some(Value::Array(allowed)) = schema.get("enum") {
        if !allowed.contains(doc) {
            out.push(format!(
                "{here}: {doc} is none of {}",
                Value::Array(allowed.clone())
            ));
        }
    }
    if let Value::Object(fields) = doc {
        if let Some(Value::Array(required)) = schema.get("required") {
            for r in required.iter().filter_map(Value::as_str) {
                if !fields.contains_key(r) {
                    out.push(format!("{here}: required field {r:?} is missing"));
                }
            }
        }
        if let Some(Value::Object(props)) = schema.get("properties") {
            for (k, v) in fields {
                if let Some(s) = props.get(k) {
                    walk(s, v, &format!("{at}/{k}"), out);
                }
            }
        }
    }
    if let (Value::Array(items), Some(s)) = (doc, schema.get("items")) {
        for (i, v) in items.iter().enumerate() {
            walk(s, v, &format!("{at}/{i}"), out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_schema_is_json_and_names_its_kind() {
        for (kind, text) in KINDS {
            let s: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{kind}: {e}"));
            assert_eq!(s["properties"]["kind"]["const"], *kind);
            assert_eq!(
                s["properties"]["schemaVersion"]["const"],
                super::super::SCHEMA_VERSION
            );
        }
    }

    /// The kind of every `report::json` call in the sources has a schema.
    #[test]
    fn every_kind_the_cli_prints_has_a_schema() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut missing = Vec::new();
        let mut stack = vec![src];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).expect("read src").flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                for part in text.split("report::json(\"").skip(1) {
                    let kind = part.split('"').next().unwrap_or_default();
                    if schema(kind).is_none() {
                        missing.push(format!("{}: {kind}", p.display()));
                    }
                }
            }
        }
        assert!(missing.is_empty(), "{missing:#?}");
    }

    #[test]
    fn wrong_documents_are_rejected_with_the_place() {
        let doc = json!({"schemaVersion": 2, "kind": "ScenarioList", "scenarios": [
            {"file": "a.toml", "name": "a", "summary": "s", "error": null}
        ]});
        assert_eq!(
            check_report(&doc),
            Vec::<String>::new(),
            "a valid one passes"
        );
        let wrong = [
            (
                json!({"schemaVersion": 2, "kind": "ScenarioList"}),
                "required field \"scenarios\"",
            ),
            (
                json!({"schemaVersion": 1, "kind": "ScenarioList", "scenarios": []}),
                "/schemaVersion",
            ),
            (
                json!({"schemaVersion": 2, "kind": "ScenarioList", "scenarios": {}}),
                "/scenarios: object where the schema wants array",
            ),
            (
                json!({"schemaVersion": 2, "kind": "ScenarioList", "scenarios": [{"name": 7}]}),
                "/scenarios/0/name: integer",
            ),
            (
                json!({"schemaVersion": 2, "kind": "Nope"}),
                "no schema for kind",
            ),
        ];
        for (doc, says) in wrong {
            let errors = check_report(&doc);
            assert!(errors.iter().any(|e| e.contains(says)), "{doc}: {errors:?}");
        }
        let verdict = json!({"type": "object", "properties": {"verdict": {"type": "string", "enum": ["pass", "fail"]}}});
        assert!(validate(&verdict, &json!({"verdict": "pass"})).is_empty());
        let bad = validate(&verdict, &json!({"verdict": "Fail"}));
        assert!(
            bad.iter()
                .any(|e| e.starts_with("/verdict: \"Fail\" is none of")),
            "{bad:?}"
        );
    }
}
