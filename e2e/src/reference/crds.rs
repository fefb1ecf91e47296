//! `docs/src/reference/crds.md`: every field of every swimlb custom resource, walked from the
//! CRD schemas (`CustomResourceExt::crd()`, what `deploy/crds.yaml` holds).

use std::fmt::Write as _;

use anyhow::{Context as _, ensure};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube::CustomResourceExt as _;
use swimlb_config::crd::{IPAddressPool, L2Advertisement, ServiceL2Status};

use super::{code, generated_comment, table};

/// The page's text.
pub fn page() -> anyhow::Result<String> {
    let mut out = generated_comment();
    out.push_str(
        "# Custom resources\n\n\
         swimlb is configured in Kubernetes with custom resources of group `swimlb.io`, version \
         `v1beta1`, whose fields are MetalLB's `metallb.io/v1beta1` ones: an `IPAddressPool` \
         holds addresses for LoadBalancer Services, an `L2Advertisement` says which pools are \
         announced from which nodes and interfaces, and the speakers write a \
         `ServiceL2Status` for each announced Service. Below is every field of each, from the \
         schemas the API server validates with (`deploy/crds.yaml`; `crdgen` prints them): its \
         path, type, default, the values the schema accepts and what it means. The controller \
         validates pools and advertisements further and reports every error in the object's \
         status and in Events. In a path, `[]` stands for any element of a list.\n\n",
    );
    let mut shared = Shared::default();
    for crd in [
        IPAddressPool::crd(),
        L2Advertisement::crd(),
        ServiceL2Status::crd(),
    ] {
        crd_section(&mut out, &crd, &mut shared)?;
    }
    for (kind, heading, intro) in [
        (
            Kubernetes::LabelSelector,
            "Label selectors",
            "A label selector, as everywhere in Kubernetes: an object matches when it has every \
             label of `matchLabels` and meets every requirement of `matchExpressions`; an empty \
             selector matches every object.",
        ),
        (
            Kubernetes::Condition,
            "Conditions",
            "A condition, as everywhere in Kubernetes (`metav1.Condition`).",
        ),
    ] {
        let Some(schema) = shared
            .schemas
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, s)| s)
        else {
            continue;
        };
        let _ = writeln!(out, "## {heading}\n\n{intro}\n");
        let mut rows = Vec::new();
        for (name, child) in schema.properties.iter().flatten() {
            let required = schema.required.iter().flatten().any(|r| r == name);
            fields(&mut rows, name, child, required, &mut Shared::default());
        }
        out.push_str(&table(
            &["Field", "Type", "Default", "Accepted", "Meaning"],
            &rows,
        ));
        out.push('\n');
    }
    Ok(out)
}

/// The Kubernetes types the schemas embed, described once at the end of the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kubernetes {
    LabelSelector,
    Condition,
}

impl Kubernetes {
    /// Which one `schema` is, by its fields.
    fn of(schema: &JSONSchemaProps) -> Option<Kubernetes> {
        let names: Vec<&str> = schema
            .properties
            .iter()
            .flatten()
            .map(|(n, _)| n.as_str())
            .collect();
        match names.as_slice() {
            ["matchExpressions", "matchLabels"] => Some(Kubernetes::LabelSelector),
            [
                "lastTransitionTime",
                "message",
                "observedGeneration",
                "reason",
                "status",
                "type",
            ] => Some(Kubernetes::Condition),
            _ => None,
        }
    }

    /// How Kubernetes' own description of the type starts.
    fn generic_description(self) -> &'static str {
        match self {
            Kubernetes::LabelSelector => "A label selector is a label query",
            Kubernetes::Condition => "Condition contains details",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kubernetes::LabelSelector => "[label selector](#label-selectors)",
            Kubernetes::Condition => "[Condition](#conditions)",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Kubernetes::LabelSelector => "[label selectors](#label-selectors)",
            Kubernetes::Condition => "[Conditions](#conditions)",
        }
    }
}

/// The embedded Kubernetes types met so far, with their schemas.
#[derive(Debug, Default)]
struct Shared {
    schemas: Vec<(Kubernetes, JSONSchemaProps)>,
}

impl Shared {
    fn note(&mut self, kind: Kubernetes, schema: &JSONSchemaProps) {
        if !self.schemas.iter().any(|(k, _)| *k == kind) {
            self.schemas.push((kind, schema.clone()));
        }
    }
}

fn crd_section(
    out: &mut String,
    crd: &CustomResourceDefinition,
    shared: &mut Shared,
) -> anyhow::Result<()> {
    let names = &crd.spec.names;
    let name = crd.metadata.name.clone().unwrap_or_default();
    ensure!(crd.spec.versions.len() == 1, "{name}: one version expected");
    let version = &crd.spec.versions[0];
    let root = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .with_context(|| format!("{name}: no schema"))?;
    let _ = writeln!(out, "## {}\n", names.kind);
    let spec = root.properties.as_ref().and_then(|p| p.get("spec"));
    if let Some(description) = spec.and_then(|s| s.description.as_deref()) {
        let _ = writeln!(out, "{}\n", one_line(description));
    }
    let mut facts = vec![
        format!("`apiVersion: {}/{}`", crd.spec.group, version.name),
        format!("`kind: {}`", names.kind),
        format!("{} (`{}`)", crd.spec.scope.to_lowercase(), name),
    ];
    if let Some(short) = names.short_names.as_ref().filter(|s| !s.is_empty()) {
        let short: Vec<String> = short.iter().map(|s| code(s)).collect();
        facts.push(format!("short name {}", short.join(", ")));
    }
    let _ = writeln!(out, "{}.\n", facts.join(", "));
    let mut rows = Vec::new();
    for part in ["spec", "status"] {
        let Some(schema) = root.properties.as_ref().and_then(|p| p.get(part)) else {
            continue;
        };
        let required = root
            .required
            .as_ref()
            .is_some_and(|r| r.iter().any(|n| n == part));
        fields(&mut rows, part, schema, required, shared);
    }
    out.push_str(&table(
        &["Field", "Type", "Default", "Accepted", "Meaning"],
        &rows,
    ));
    out.push('\n');
    Ok(())
}

/// The row of the field at `path`, then the rows of the fields inside it (but for the
/// Kubernetes types, described once).
fn fields(
    rows: &mut Vec<Vec<String>>,
    path: &str,
    schema: &JSONSchemaProps,
    required: bool,
    shared: &mut Shared,
) {
    let description = schema
        .description
        .as_deref()
        .map(one_line)
        .unwrap_or_default();
    let default = schema
        .default
        .as_ref()
        .map(|d| code(&d.0.to_string()))
        .unwrap_or_else(|| {
            if required {
                "required".into()
            } else {
                "-".into()
            }
        });
    let item = match &schema.items {
        Some(JSONSchemaPropsOrArray::Schema(item)) => Some(item.as_ref()),
        _ => None,
    };
    let embedded = Kubernetes::of(schema)
        .map(|k| (k, k.name().to_string(), schema))
        .or_else(|| {
            let item = item?;
            Kubernetes::of(item).map(|k| (k, format!("list of {}", k.plural()), item))
        });
    let type_ = match &embedded {
        Some((_, name, _)) => name.clone(),
        None => type_of(schema),
    };
    // The generic description of an embedded type says nothing of this field, and the spec's
    // is the section's introduction.
    let description = match embedded {
        Some((kind, _, _)) if description.starts_with(kind.generic_description()) => String::new(),
        _ if path == "spec" => String::new(),
        _ => description,
    };
    rows.push(vec![
        code(path),
        type_,
        default,
        accepted(schema),
        description,
    ]);
    if let Some((kind, _, inner)) = embedded {
        shared.note(kind, inner);
        return;
    }
    if let Some(properties) = &schema.properties {
        let required: &[String] = schema.required.as_deref().unwrap_or(&[]);
        for (name, child) in properties {
            fields(
                rows,
                &format!("{path}.{name}"),
                child,
                required.iter().any(|r| r == name),
                shared,
            );
        }
    }
    if let Some(JSONSchemaPropsOrArray::Schema(item)) = &schema.items
        && item.properties.is_some()
    {
        let required: &[String] = item.required.as_deref().unwrap_or(&[]);
        if let Some(properties) = &item.properties {
            for (name, child) in properties {
                fields(
                    rows,
                    &format!("{path}[].{name}"),
                    child,
                    required.iter().any(|r| r == name),
                    shared,
                );
            }
        }
    }
}

/// `string`, `integer (int32)`, `list of objects`, `map of string to string`.
fn type_of(schema: &JSONSchemaProps) -> String {
    let base = schema.type_.as_deref().unwrap_or("any");
    let with_format = |base: &str, s: &JSONSchemaProps| match &s.format {
        Some(format) => format!("{base} ({format})"),
        None => base.to_string(),
    };
    match base {
        "array" => match &schema.items {
            Some(JSONSchemaPropsOrArray::Schema(item)) => {
                let item_type = item.type_.as_deref().unwrap_or("any");
                format!("list of {}", with_format(&plural(item_type), item))
            }
            _ => "list".into(),
        },
        "object" => match &schema.additional_properties {
            Some(JSONSchemaPropsOrBool::Schema(value)) => format!(
                "map of string to {}",
                value.type_.as_deref().unwrap_or("any")
            ),
            _ => "object".into(),
        },
        other => with_format(other, schema),
    }
}

fn plural(type_: &str) -> String {
    match type_ {
        "object" => "objects".into(),
        "string" => "strings".into(),
        "integer" => "integers".into(),
        "boolean" => "booleans".into(),
        other => other.into(),
    }
}

/// The schema's constraints: range, enum, pattern, lengths, list sizes.
fn accepted(schema: &JSONSchemaProps) -> String {
    let mut parts = Vec::new();
    match (schema.minimum, schema.maximum) {
        (Some(min), Some(max)) => parts.push(format!("{min} to {max}")),
        (Some(min), None) => parts.push(format!("at least {min}")),
        (None, Some(max)) => parts.push(format!("at most {max}")),
        (None, None) => {}
    }
    if let Some(values) = &schema.enum_ {
        let values: Vec<String> = values.iter().map(|v| code(&v.0.to_string())).collect();
        parts.push(format!("one of {}", values.join(", ")));
    }
    if let Some(pattern) = &schema.pattern {
        parts.push(format!("matches {}", code(pattern)));
    }
    match (schema.min_length, schema.max_length) {
        (Some(min), Some(max)) => parts.push(format!("{min} to {max} characters")),
        (Some(min), None) => parts.push(format!("at least {min} characters")),
        (None, Some(max)) => parts.push(format!("at most {max} characters")),
        (None, None) => {}
    }
    match (schema.min_items, schema.max_items) {
        (Some(min), Some(max)) => parts.push(format!("{min} to {max} items")),
        (Some(min), None) => parts.push(format!("at least {min} items")),
        (None, Some(max)) => parts.push(format!("at most {max} items")),
        (None, None) => {}
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join("; ")
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
